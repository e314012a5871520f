package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// Process-level tests of host calls and their journal (docs/DESIGN.md
// invariants 12 and 13): real `paddock serve` processes on a real
// PostgreSQL, a real OpenAI-compatible model server and a real HTTP
// destination, both started by the test; the agent is
// cmd/paddock/testdata/hcagent, which makes the host calls its event
// message lists and replies with what each returned.

const hcAgentPkg = "./cmd/paddock/testdata/hcagent"

// modelServer is an OpenAI-compatible chat-completions server scripted by
// the test: answer decides each reply. It counts requests by their
// Idempotency-Key header and keeps every Authorization header it got.
type modelServer struct {
	*httptest.Server
	mu     sync.Mutex
	byKey  map[string]int
	total  int
	auths  []string
	answer func(n int, body map[string]any, w http.ResponseWriter, r *http.Request)
}

func newModelServer(t *testing.T, answer func(n int, body map[string]any, w http.ResponseWriter, r *http.Request)) *modelServer {
	m := &modelServer{byKey: map[string]int{}, answer: answer}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		m.mu.Lock()
		m.total++
		n := m.total
		m.byKey[r.Header.Get("Idempotency-Key")]++
		m.auths = append(m.auths, r.Header.Get("Authorization"))
		m.mu.Unlock()
		if r.URL.Path != "/v1/chat/completions" {
			http.Error(w, `{"error":{"message":"no such path"}}`, 404)
			return
		}
		m.answer(n, body, w, r)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *modelServer) counts() (total int, byKey map[string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.byKey {
		out[k] = v
	}
	return m.total, out
}

// chatCompletion writes an unstreamed chat completion whose content is text.
func chatCompletion(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "application/json")
	b, _ := json.Marshal(map[string]any{
		"id": "c1", "model": "gpt-test",
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": 7, "completion_tokens": 3},
	})
	_, _ = w.Write(b)
}

// hcConfig writes a serve config on PostgreSQL (dsn) with the hcagent agent
// allowed the model endpoint "m" at modelURL and http GET/POST to the
// destinations in allow (host:port, IP literals); extra is appended at the
// top level (secrets:, models' secret is set when secret is not empty).
func hcConfig(t *testing.T, dir, addr, dsn, modelURL, secret string, allow []string, extra string) string {
	t.Helper()
	agent, _ := wasmtest.BuildExample(t, hcAgentPkg)
	var rules strings.Builder
	for _, hp := range allow {
		h, p, _ := strings.Cut(hp, ":")
		fmt.Fprintf(&rules, "        - scheme: http\n          host: %q\n          port: %s\n          methods: [GET, POST]\n", h, p)
		if secret != "" {
			fmt.Fprintf(&rules, "          secrets: [%s]\n", secret)
		}
	}
	secretLine, secretsGrant := "", ""
	if secret != "" {
		secretLine = "    secret: " + secret + "\n"
		secretsGrant = "      secrets: [" + secret + "]\n"
	}
	cfg := fmt.Sprintf(`listen: %s
data_dir: %s
wasm:
  cache_dir: %s
store:
  driver: postgres
  dsn: %q
runtime:
  lease_ttl: 2s
  scan_interval: 200ms
policy:
  idle_timeout: 5s
  backoff_min: 100ms
  backoff_max: 500ms
  max_attempts: 5
  turn_timeout: 2m
host_calls:
  timeout: 90s
models:
  m:
    provider: openai
    base_url: %s/v1
    models: [gpt-test]
%s%sagents:
  - name: hc
    module_file: %s
    capabilities:
      models: [m]
%s      http:
%s`, addr, filepath.Join(dir, "data-"+strings.ReplaceAll(addr, ":", "_")), e2eCacheDir(t), dsn, modelURL, secretLine, extra,
		agent, secretsGrant, rules.String())
	p := filepath.Join(dir, "paddock-"+strings.ReplaceAll(addr, ":", "_")+".yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// calls encodes host-call requests as an hcagent event message.
func callsMessage(t *testing.T, reqs ...abi.CallRequest) string {
	t.Helper()
	b, err := json.Marshal(reqs)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func modelCall(text string) abi.CallRequest {
	return abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: "m",
		Messages: []abi.ModelMessage{{Role: abi.RoleUser, Content: text}}}}
}

func httpCall(u string, headers map[string]string) abi.CallRequest {
	return abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{URL: u, Headers: headers}}
}

// hcOutcome is one element of an hcagent reply.
type hcOutcome struct {
	Seq      int    `json:"seq"`
	Replayed bool   `json:"replayed"`
	Status   int    `json:"status"`
	Content  string `json:"content"`
	Body     string `json:"body"`
	Error    string `json:"error"`
}

// lastReply decodes the hcagent reply of the session's only turn.
func onlyTurnReply(t *testing.T, s *server, sess string) []hcOutcome {
	t.Helper()
	ts := s.transcript("hc", sess)
	if len(ts) != 1 {
		t.Fatalf("transcript holds %d turns, want 1: %+v", len(ts), ts)
	}
	msgs := ts[0].Messages
	var out []hcOutcome
	if err := json.Unmarshal([]byte(msgs[len(msgs)-1].Content), &out); err != nil {
		t.Fatalf("reply %q: %v", msgs[len(msgs)-1].Content, err)
	}
	return out
}

// journalRow is a host_calls row read with SQL.
type journalRow struct {
	Seq           int
	Epoch         int64
	Kind          string
	Destination   string
	ErrorCode     string
	Result        []byte
	Replays       int
	ReplayedEpoch int64
	SetAside      bool
	RequestDigest string
	Text          string // the whole row as PostgreSQL renders it
}

// journal reads every host_calls row of the event, in id order.
func journal(t *testing.T, dsn string, eventID int64) []journalRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT seq, actor_epoch, kind, destination, error_code, result, replays, replayed_epoch, set_aside, request_digest, h::text
		FROM host_calls h WHERE event_id = $1 ORDER BY id`, eventID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (journalRow, error) {
		var j journalRow
		err := r.Scan(&j.Seq, &j.Epoch, &j.Kind, &j.Destination, &j.ErrorCode, &j.Result, &j.Replays, &j.ReplayedEpoch, &j.SetAside, &j.RequestDigest, &j.Text)
		return j, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// metric sums the samples of a metric family on a host's /metrics (-1 when
// it cannot be read).
func metric(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// agentUID returns the uid of agent hc.
func agentUID(t *testing.T, s *server) string {
	t.Helper()
	a, err := s.api().GetAgent(context.Background(), "hc")
	if err != nil {
		t.Fatal(err)
	}
	return a.UID
}

// TestHostCallKillDashNineAfterTheModelAnsweredReplaysOnRetry kills the
// host with SIGKILL after the turn's model call was answered (and so
// journaled) while its second host call is in flight. The restarted host
// retries the event: the model call is replayed from the journal (the
// model server saw it once), the http call goes live again, the turn
// commits once.
func TestHostCallKillDashNineAfterTheModelAnsweredReplaysOnRetry(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		chatCompletion(w, fmt.Sprintf("answer %d", n))
	})
	var pageMu sync.Mutex
	pageHits := 0
	inFlight := make(chan struct{}, 1)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pageMu.Lock()
		pageHits++
		n := pageHits
		pageMu.Unlock()
		if n == 1 {
			// The first attempt's call 2: the test kills the host now; the
			// request never gets an answer.
			inFlight <- struct{}{}
			<-r.Context().Done()
			return
		}
		_, _ = io.WriteString(w, "the page")
	}))
	t.Cleanup(page.Close)
	pu, _ := url.Parse(page.URL)

	dir := t.TempDir()
	addr := freePort(t)
	cfg := hcConfig(t, dir, addr, dsn, model.URL, "", []string{pu.Host}, "")
	srv := startServer(t, cfg, addr)
	sess := srv.cli("session", "create", "hc")
	srv.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("hello"), httpCall(page.URL+"/p", nil)))

	select {
	case <-inFlight:
	case <-time.After(2 * time.Minute):
		t.Fatal("the http call of the turn never arrived")
	}
	srv.kill9()
	killed := time.Now()
	srv = startServer(t, cfg, addr)
	waitUntil(t, "the retried turn to commit", time.Minute, func() bool { return len(srv.transcript("hc", sess)) == 1 })
	figure(t, "host calls: kill -9 mid-turn → retried turn committed %.1f s after the kill (lease_ttl 2s)", time.Since(killed).Seconds())

	out := onlyTurnReply(t, srv, sess)
	if len(out) != 2 || out[0].Seq != 1 || !out[0].Replayed || out[0].Content != "answer 1" || out[0].Error != "" ||
		out[1].Seq != 2 || out[1].Replayed || out[1].Status != 200 || out[1].Body != "the page" {
		t.Errorf("reply %+v: want call 1 replayed with %q, call 2 live with the page", out, "answer 1")
	}
	total, byKey := model.counts()
	if total != 1 {
		t.Errorf("the model server got %d requests (%v), want 1: the retry must replay call 1", total, byKey)
	}
	evs := srv.events("hc", sess)
	wantKey := calls.IdempotencyHeader(fmt.Sprintf("%s-%d-%d-%s", agentUID(t, srv), evs[0].ID, 1, journal(t, dsn, evs[0].ID)[0].RequestDigest))
	if byKey[wantKey] != 1 || len(byKey) != 1 {
		t.Errorf("requests by Idempotency-Key %v, want one under %s (agent, event, seq 1, request digest)", byKey, wantKey)
	}
	if len(evs) != 1 || evs[0].Status != "done" || evs[0].Attempts != 1 {
		t.Errorf("events %+v: want one done event with 1 failed attempt", evs)
	}
	rows := journal(t, dsn, evs[0].ID)
	if len(rows) != 2 {
		t.Fatalf("journal rows %+v, want 2", rows)
	}
	turns := srv.transcript("hc", sess)
	if r := rows[0]; r.Seq != 1 || r.Kind != "model" || r.SetAside || r.Replays < 1 || r.ReplayedEpoch != turns[0].ActorEpoch || r.Epoch >= turns[0].ActorEpoch {
		t.Errorf("journal row 1 %+v: want seq 1 of the first epoch, replayed ≥ once by the committing epoch %d", r, turns[0].ActorEpoch)
	}
	if r := rows[1]; r.Seq != 2 || r.Kind != "http" || r.SetAside || r.Epoch != turns[0].ActorEpoch || r.ErrorCode != "" {
		t.Errorf("journal row 2 %+v: want seq 2 recorded by the committing epoch %d", r, turns[0].ActorEpoch)
	}
	if got := metric(srv.addr, "paddock_host_calls_replayed_total"); got < 1 {
		t.Errorf("paddock_host_calls_replayed_total = %v on the restarted host, want ≥ 1", got)
	}
}

// TestHostCallOfAStoppedHostIsFencedOff runs two hosts on one PostgreSQL.
// Host A's turn is inside its model call when A is stopped (SIGSTOP) past
// its lease; host B retries the event, its call goes live and it commits.
// Then A's answer arrives and A resumes: the fences refuse A's journal
// write and its commit — one journal row, B's, and one turn.
func TestHostCallOfAStoppedHostIsFencedOff(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			held <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			chatCompletion(w, "from A")
			return
		}
		chatCompletion(w, "from B")
	})
	dir := t.TempDir()
	addrA, addrB := freePort(t), freePort(t)
	cfgA := hcConfig(t, dir, addrA, dsn, model.URL, "", nil, "")
	cfgB := hcConfig(t, dir, addrB, dsn, model.URL, "", nil, "")
	a := startServer(t, cfgA, addrA)
	// SIGCONT before the cleanup's SIGTERM, whatever happens.
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })

	sess := a.cli("session", "create", "hc")
	a.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("who answers?")))
	select {
	case <-held:
	case <-time.After(2 * time.Minute):
		t.Fatal("host A's model call never arrived")
	}
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	b := startServer(t, cfgB, addrB)
	waitUntil(t, "host B to commit the retried turn", 2*time.Minute, func() bool { return len(b.transcript("hc", sess)) == 1 })
	figure(t, "host calls: SIGSTOP of the host in a model call → other host committed %.1f s later (lease_ttl 2s)", time.Since(stopped).Seconds())
	if total, _ := model.counts(); total != 2 {
		t.Errorf("the model server got %d requests, want 2 (A's, held; B's live retry)", total)
	}

	// A's answer arrives; A resumes.
	close(release)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "host A's journal write to be refused by the fences", time.Minute, func() bool {
		return metric(a.addr, "paddock_host_calls_fenced_total") >= 1
	})
	// A's attempt ends without a commit: either its agent gets the
	// cancelled result and replies, and the fences refuse the reply, or A
	// noticed its lost lease first and ended the turn, and the fences
	// refuse recording the failed attempt.
	aLog := func() string {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.log.String()
	}
	waitUntil(t, "host A's attempt to be refused by the fences", time.Minute, func() bool {
		l := aLog()
		return strings.Contains(l, "reply rejected by fence") || strings.Contains(l, "failed attempt fenced off")
	})
	waitUntil(t, "host A to drop its controller", time.Minute, func() bool { return controllers(t, a.addr) == 0 })
	if !strings.Contains(aLog(), "host call result refused by the fences") {
		t.Errorf("host A's log does not tell its call result was refused:\n%s", aLog())
	}
	if _, byKey := model.counts(); len(byKey) != 1 {
		t.Errorf("Idempotency-Keys %v: want A's and B's requests under one key (same event, same seq)", byKey)
	}
	turns := b.transcript("hc", sess)
	if len(turns) != 1 {
		t.Fatalf("transcript holds %d turns, want 1", len(turns))
	}
	out := onlyTurnReply(t, b, sess)
	if len(out) != 1 || out[0].Content != "from B" || out[0].Replayed || out[0].Seq != 1 {
		t.Errorf("reply %+v: want B's live answer", out)
	}
	evs := b.events("hc", sess)
	if len(evs) != 1 || evs[0].Status != "done" {
		t.Fatalf("events %+v: want one done event", evs)
	}
	rows := journal(t, dsn, evs[0].ID)
	if len(rows) != 1 {
		t.Fatalf("journal rows %+v: want exactly one (B's); A's result must not be recorded", rows)
	}
	if r := rows[0]; r.Seq != 1 || r.SetAside || r.Epoch != turns[0].ActorEpoch || !bytes.Contains(r.Result, []byte("from B")) {
		t.Errorf("journal row %+v: want seq 1, live, recorded under B's epoch %d with B's answer", r, turns[0].ActorEpoch)
	}
	if got := metric(a.addr, "paddock_host_calls_fenced_total"); got != 1 {
		t.Errorf("paddock_host_calls_fenced_total on A = %v, want 1", got)
	}
}

// TestPlantedSecretAppearsNowhere plants a secret with a distinctive value
// (the model endpoint's key and an http header filled from
// "{{secret:NAME}}"), runs calls that use it — answered, refused by an
// upstream 401 that echoes the credential back, denied by the capabilities
// — and greps for the value everywhere the host puts things: its logs, the
// API's answers (transcript, events, agent, session), /metrics, every
// journal row and every table of the database.
func TestPlantedSecretAppearsNowhere(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	planted := "sk-PLANTED-" + hex.EncodeToString(rnd[:])
	envName := "HCE2E_PLANTED_" + strings.ToUpper(hex.EncodeToString(rnd[:4]))

	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		msgs, _ := body["messages"].([]any)
		last := ""
		if len(msgs) > 0 {
			last, _ = msgs[len(msgs)-1].(map[string]any)["content"].(string)
		}
		if last == "reject me" {
			// An upstream that echoes the credential in its error body.
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("WWW-Authenticate", "Bearer realm=\""+r.Header.Get("Authorization")+"\"")
			w.WriteHeader(http.StatusUnauthorized)
			b, _ := json.Marshal(map[string]any{"error": map[string]any{
				"message": "Incorrect API key provided: " + r.Header.Get("Authorization"), "type": "invalid_request_error"}})
			_, _ = w.Write(b)
			return
		}
		auth := r.Header.Get("Authorization")
		switch last {
		case "echo me":
			// An endpoint that echoes the credential in an answer.
			chatCompletion(w, "your key is "+auth)
			return
		case "stream me":
			// The same, streamed: the credential split across chunks, and
			// in a tool call's arguments.
			w.Header().Set("Content-Type", "text/event-stream")
			half := len(auth) / 2
			args, _ := json.Marshal(map[string]string{"key": auth})
			argsJSON, _ := json.Marshal(string(args))
			for _, ev := range []string{
				`{"id":"c2","model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":"streamed ` + auth[:half] + `"}}]}`,
				`{"id":"c2","model":"gpt-test","choices":[{"index":0,"delta":{"content":"` + auth[half:] + `"}}]}`,
				`{"id":"c2","model":"gpt-test","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"t","arguments":` + string(argsJSON) + `}}]}}]}`,
				`{"id":"c2","model":"gpt-test","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
				"[DONE]",
			} {
				fmt.Fprintf(w, "data: %s\n\n", ev)
				w.(http.Flusher).Flush()
			}
			return
		}
		chatCompletion(w, "fine")
	})
	var pageMu sync.Mutex
	var pageKeys []string
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		pageMu.Lock()
		pageKeys = append(pageKeys, key)
		pageMu.Unlock()
		// Echo the credential back in a header and the body.
		w.Header().Set("X-Echo", key)
		if r.URL.Path == "/deny" {
			w.WriteHeader(http.StatusUnauthorized)
		}
		_, _ = io.WriteString(w, "you sent "+key+" and "+r.Header.Get("Authorization"))
	}))
	t.Cleanup(page.Close)
	pu, _ := url.Parse(page.URL)
	other := freePort(t) // an address no rule allows

	dir := t.TempDir()
	addr := freePort(t)
	extra := fmt.Sprintf("secrets:\n  llmkey:\n    env: %s\n", envName)
	cfg := hcConfig(t, dir, addr, dsn, model.URL, "llmkey", []string{pu.Host}, extra)
	srv := startServerEnv(t, cfg, addr, envName+"="+planted)

	var fetched []string // every API answer
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get("http://" + srv.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fetched = append(fetched, path+" → "+string(b))
		return string(b)
	}
	sess := srv.cli("session", "create", "hc")
	withKey := map[string]string{"X-Api-Key": "{{secret:llmkey}}", "Authorization": "Bearer {{secret:llmkey}}"}
	msg := callsMessage(t,
		modelCall("hello"),                      // answered; the key in Authorization
		modelCall("reject me"),                  // a 401 that echoes the key
		httpCall(page.URL+"/echo", withKey),     // the secret filled into headers, echoed back
		httpCall(page.URL+"/deny", withKey),     // a 401 with the echo
		httpCall("http://"+other+"/x", withKey), // denied: no rule for the destination
		httpCall(page.URL+"/y", map[string]string{"X-Api-Key": "{{secret:nosuch}}"}), // a secret not granted
		modelCall("echo me"),   // an answer that echoes the key
		modelCall("stream me"), // a streamed answer that echoes it, in text and tool arguments
	)
	fetched = append(fetched, srv.cli("signal", "send", "hc", sess, msg, "--wait"))
	waitUntil(t, "the turn to commit", time.Minute, func() bool { return len(srv.transcript("hc", sess)) == 1 })

	out := onlyTurnReply(t, srv, sess)
	if len(out) != 8 {
		t.Fatalf("reply %+v: want 8 outcomes", out)
	}
	for _, o := range out {
		t.Logf("call %d: status %d content %q body %q error %q", o.Seq, o.Status, o.Content, o.Body, o.Error)
	}
	if out[0].Content != "fine" || !strings.HasPrefix(out[1].Error, "upstream") || out[1].Status != 401 ||
		out[2].Status != 200 || out[3].Status != 401 || !strings.HasPrefix(out[4].Error, "denied") || out[5].Error == "" ||
		!strings.HasPrefix(out[6].Content, "your key is") || !strings.HasPrefix(out[7].Content, "streamed") {
		t.Errorf("outcomes %+v: want answered, upstream 401, 200, 401, denied, refused, answered, answered", out)
	}
	// Not vacuous: the value did go out, in the requests it was granted for.
	model.mu.Lock()
	auths := append([]string(nil), model.auths...)
	model.mu.Unlock()
	if len(auths) != 4 {
		t.Errorf("the model server got %d requests, want 4", len(auths))
	}
	for _, a := range auths {
		if a != "Bearer "+planted {
			t.Errorf("the model server got Authorization %q, want the planted key", a)
		}
	}
	pageMu.Lock()
	keys := append([]string(nil), pageKeys...)
	pageMu.Unlock()
	if len(keys) < 2 || keys[0] != planted || keys[1] != planted {
		t.Errorf("the http destination got X-Api-Key %q, want the planted value on /echo and /deny", keys)
	}
	for i, k := range keys[min(2, len(keys)):] {
		if k == planted {
			t.Errorf("request %d to the destination carried the secret it was not granted for", i+2)
		}
	}

	// The places to search.
	evs := srv.events("hc", sess)
	get("/v1/agents/hc")
	get("/v1/agents/hc/sessions")
	get("/v1/agents/hc/sessions/" + sess)
	get("/v1/agents/hc/sessions/" + sess + "/events")
	for _, e := range evs {
		get(fmt.Sprintf("/v1/agents/hc/sessions/%s/events/%d", sess, e.ID))
	}
	get("/v1/agents/hc/sessions/" + sess + "/transcript")
	get("/metrics")
	fetched = append(fetched, srv.cli("transcript", "hc", sess))
	for _, o := range out {
		fetched = append(fetched, o.Error, o.Body, o.Content)
	}

	// The value in every encoding the host might store it in.
	needles := []string{planted, hex.EncodeToString([]byte(planted))}
	for off := range 3 {
		// base64 of the value at each alignment, trimmed to the stable part.
		enc := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("x", off) + planted))
		needles = append(needles, enc[4:len(enc)-4])
	}
	check := func(where, text string) {
		t.Helper()
		for _, n := range needles {
			if strings.Contains(strings.ToLower(text), strings.ToLower(n)) {
				t.Errorf("the planted secret (as %q) appears in %s:\n%s", n, where, text)
			}
		}
	}
	for _, f := range fetched {
		check("an API answer", f)
	}
	rows := journal(t, dsn, evs[0].ID)
	if len(rows) != 8 {
		t.Errorf("journal holds %d rows, want 8 (every call numbered, refusals included)", len(rows))
	}
	for _, r := range rows {
		check(fmt.Sprintf("journal row %d", r.Seq), r.Text)
		check(fmt.Sprintf("journal row %d's result", r.Seq), string(r.Result))
		var res abi.CallResult
		if err := json.Unmarshal(r.Result, &res); err != nil {
			t.Errorf("journal row %d: result %q: %v", r.Seq, r.Result, err)
			continue
		}
		if res.HTTP != nil {
			check(fmt.Sprintf("journal row %d's response body", r.Seq), string(res.HTTP.Body))
			for k, v := range res.HTTP.Headers {
				check(fmt.Sprintf("journal row %d's response header %s", r.Seq, k), v)
			}
		}
	}
	// Every table of the database, every row as text (bytea as hex).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tables, err := conn.Query(ctx, `SELECT quote_ident(table_name) FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(tables, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 5 {
		t.Fatalf("only %d tables: %v", len(names), names)
	}
	for _, tb := range names {
		rs, err := conn.Query(ctx, "SELECT t::text FROM "+tb+" t")
		if err != nil {
			t.Fatal(err)
		}
		texts, err := pgx.CollectRows(rs, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range texts {
			check("table "+tb, s)
		}
	}
	// The host's own output, last: everything above has been logged.
	srv.mu.Lock()
	logText := srv.log.String()
	srv.mu.Unlock()
	check("the host's log", logText)
	if !strings.Contains(logText, "paddock serving") {
		t.Errorf("the host's log looks empty: %q", logText)
	}
}

// startServerEnv is startServer with more environment variables for the
// host process.
func startServerEnv(t *testing.T, cfg, addr string, env ...string) *server {
	t.Helper()
	warmCache(t)
	s := &server{t: t, addr: addr, log: &bytes.Buffer{}, mu: &sync.Mutex{}}
	s.cmd = exec.Command(paddockBin(t), "serve", "--config", cfg)
	s.cmd.Stderr = syncBuffer{s.mu, s.log}
	s.cmd.Stdout = syncBuffer{s.mu, s.log}
	s.cmd.Env = append(append(os.Environ(), "PADDOCK_LOG__LEVEL=debug"), env...)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			<-s.done
		}
		if t.Failed() {
			s.mu.Lock()
			t.Logf("paddock serve log:\n%s", s.log.String())
			s.mu.Unlock()
		}
	})
	waitUntil(t, "paddock serve to become healthy", 3*time.Minute, func() bool {
		select {
		case <-s.done:
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Fatalf("paddock serve exited before it became healthy:\n%s", s.log.String())
		default:
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return s
}

// TestHostCallPastItsLeaseOnOneHostIsRefused stops the only host (SIGSTOP)
// in a model call until its lease has expired by the database's clock, with
// no other host to take the session over; then the answer arrives and the
// host resumes. Its lease is not renewed once expired, so the fences refuse
// the late result (invariant 12: "unexpired lease by the database's
// clock"); the host's watchdog retries the event on a new epoch, whose call
// goes live, and the turn commits once with one journal row.
func TestHostCallPastItsLeaseOnOneHostIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			held <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			chatCompletion(w, "late")
			return
		}
		chatCompletion(w, "retried")
	})
	dir := t.TempDir()
	addr := freePort(t)
	srv := startServer(t, hcConfig(t, dir, addr, dsn, model.URL, "", nil, ""), addr)
	t.Cleanup(func() { _ = srv.cmd.Process.Signal(syscall.SIGCONT) })
	if os.Getenv("HCE2E_DUMP") != "" {
		t.Cleanup(func() { srv.mu.Lock(); t.Logf("log:\n%s", srv.log.String()); srv.mu.Unlock() })
	}
	sess := srv.cli("session", "create", "hc")
	srv.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("are you there?")))
	select {
	case <-held:
	case <-time.After(2 * time.Minute):
		t.Fatal("the model call never arrived")
	}
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Wait past the lease (2 s) by the database's clock: the activation's
	// lease_expires_at is in the past.
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	waitUntil(t, "the stopped host's lease to expire", time.Minute, func() bool {
		var expired bool
		err := conn.QueryRow(context.Background(),
			`SELECT coalesce(bool_and(lease_expires_at < clock_timestamp()), false) FROM activations WHERE state IN ('starting', 'active', 'draining')`).Scan(&expired)
		if err != nil {
			t.Logf("read leases: %v", err)
			return false
		}
		return expired
	})
	close(release)
	if err := srv.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the retried turn to commit", time.Minute, func() bool { return len(srv.transcript("hc", sess)) == 1 })
	if got := metric(srv.addr, "paddock_host_calls_fenced_total"); got < 1 {
		t.Errorf("paddock_host_calls_fenced_total = %v, want ≥ 1: the late result came past the lease", got)
	}
	out := onlyTurnReply(t, srv, sess)
	if len(out) != 1 || out[0].Content != "retried" || out[0].Replayed {
		t.Errorf("reply %+v: want the retry's live answer", out)
	}
	if total, _ := model.counts(); total != 2 {
		t.Errorf("the model server got %d requests, want 2", total)
	}
	turns := srv.transcript("hc", sess)
	evs := srv.events("hc", sess)
	rows := journal(t, dsn, evs[0].ID)
	if len(rows) != 1 || rows[0].Seq != 1 || rows[0].SetAside || rows[0].Epoch != turns[0].ActorEpoch || !bytes.Contains(rows[0].Result, []byte("retried")) {
		t.Errorf("journal rows %+v: want one, the retry's (epoch %d)", rows, turns[0].ActorEpoch)
	}
}

// TestHostCallKillDashNineBeforeTheModelAnsweredCallsAgainUnderOneKey kills
// the host with SIGKILL while the turn's model call is in flight: nothing
// was journaled, so the retry calls the model again — under the same
// Idempotency-Key, (agent, event, seq, request digest), so a provider that honours the
// header bills it once — and the turn commits once with the retry's row.
func TestHostCallKillDashNineBeforeTheModelAnsweredCallsAgainUnderOneKey(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	held := make(chan struct{}, 1)
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			held <- struct{}{}
			<-r.Context().Done() // the host dies first
			return
		}
		chatCompletion(w, "second")
	})
	dir := t.TempDir()
	addr := freePort(t)
	cfg := hcConfig(t, dir, addr, dsn, model.URL, "", nil, "")
	srv := startServer(t, cfg, addr)
	sess := srv.cli("session", "create", "hc")
	srv.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("hi")))
	select {
	case <-held:
	case <-time.After(2 * time.Minute):
		t.Fatal("the model call never arrived")
	}
	srv.kill9()
	srv = startServer(t, cfg, addr)
	waitUntil(t, "the retried turn to commit", time.Minute, func() bool { return len(srv.transcript("hc", sess)) == 1 })
	out := onlyTurnReply(t, srv, sess)
	if len(out) != 1 || out[0].Content != "second" || out[0].Replayed {
		t.Errorf("reply %+v: want the retry's live answer", out)
	}
	evs := srv.events("hc", sess)
	turns := srv.transcript("hc", sess)
	rows := journal(t, dsn, evs[0].ID)
	if len(rows) > 0 {
		key := calls.IdempotencyHeader(fmt.Sprintf("%s-%d-%d-%s", agentUID(t, srv), evs[0].ID, 1, rows[0].RequestDigest))
		if total, byKey := model.counts(); total != 2 || byKey[key] != 2 {
			t.Errorf("model requests %d by key %v: want 2, both under %s", total, byKey, key)
		}
	}
	if len(rows) != 1 || rows[0].Seq != 1 || rows[0].Epoch != turns[0].ActorEpoch || rows[0].Replays != 0 {
		t.Errorf("journal rows %+v: want one, the retry's (epoch %d)", rows, turns[0].ActorEpoch)
	}
}
