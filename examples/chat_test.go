package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/chat"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// The chat example through a real host with the real host-call executor
// (host/calls) against a real HTTP server speaking the OpenAI chat
// completions protocol (streamed, as the adapter asks), scripted by the
// conversation it is sent: every worker kind that sends the same requests
// gets the same answers.

// chatKey is the API key the scripted model server expects; the host fills
// it from the secret "chat_key", the agent never sees it.
const chatKey = "sk-chat-test-0123"

// chatModel is the endpoint's one model.
const chatModel = "test-model"

// pageBody is what the test's web page answers fetch_url with.
const pageBody = "Paddock keeps agent sessions alive."

// registerChat registers the chat example as the agents "chat" (its wasm
// module), "chat-plugin" (its plugin worker) and "chat-remote" (the
// module again, on the remote pool).
func (w *world) registerChat(wr *runner.Runner) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	_, b := wasmtest.BuildExample(t, "./examples/chat/cmd")
	digest, version, err := wr.Inspect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.st.PutModule(ctx, store.PutModuleParams{Digest: digest, ABIVersion: version, Bytes: b}); err != nil {
		t.Fatal(err)
	}
	path, sum := plugintest.Build(t, "./examples/chat/plugin")
	pw := store.PluginWorker{Name: "chat-plugin", Path: path, SHA256: sum, Processes: 1}
	if err := wr.CheckPlugin(ctx, pw); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.st.PutPluginWorker(ctx, pw); err != nil {
		t.Fatal(err)
	}
	for _, p := range []store.CreateAgentParams{
		{Name: "chat", Kind: store.KindWasm, ModuleDigest: digest},
		{Name: "chat-plugin", Kind: store.KindPlugin, Plugin: "chat-plugin"},
		{Name: "chat-remote", Kind: store.KindWasm, ModuleDigest: digest},
	} {
		p.UID, p.CrashPolicy, p.Upsert = uuid.NewString(), store.CrashRestart, true
		a, err := w.st.CreateAgent(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		w.agents[p.Name] = a
	}
}

// modelServer is an OpenAI-compatible chat completions server whose
// answer is a function of the conversation it is sent:
//
//   - last message from the user "remember X": a tool call add_note {"text": X};
//   - "fetch URL": a tool call fetch_url {"url": URL};
//   - "what do you remember?": a tool call list_notes {};
//   - anything else from the user: the final answer "you said: …";
//   - last message a tool's result: the final answer "tool said: …".
//
// Tool call ids and token counts derive from the conversation too. A
// request without the expected bearer key is answered 401.
type modelServer struct {
	*httptest.Server
	mu    sync.Mutex
	calls int
	// holdAt, when > 0, is the request (counted from 1) the server holds
	// without answering until its client gives up (or a minute passes);
	// held is closed when it arrives, aborted when the client gave up.
	holdAt  int
	held    chan struct{}
	aborted chan struct{}
	// anthropic: the server speaks Anthropic's Messages API instead
	// (serveAnthropic), with the same script.
	anthropic bool
}

func newModelServer(t testing.TB) *modelServer {
	m := &modelServer{held: make(chan struct{}), aborted: make(chan struct{})}
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.Close)
	return m
}

// requests returns how many requests the server answered.
func (m *modelServer) requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

func (m *modelServer) serve(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.calls++
	hold := m.calls == m.holdAt
	m.mu.Unlock()
	if hold {
		// The body read whole, the server notices the client going away.
		_, _ = io.Copy(io.Discard, r.Body)
		close(m.held)
		select {
		case <-r.Context().Done():
			close(m.aborted)
		case <-time.After(time.Minute):
		}
		return
	}
	if m.anthropic {
		m.serveAnthropic(w, r)
		return
	}
	if r.URL.Path != "/v1/chat/completions" || r.Method != http.MethodPost {
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+chatKey {
		http.Error(w, `{"error":{"message":"bad key"}}`, http.StatusUnauthorized)
		return
	}
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 || !req.Stream || req.Model != chatModel {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	chars := 0
	for _, msg := range req.Messages {
		s, _ := msg.Content.(string)
		chars += len(s)
	}
	last := req.Messages[len(req.Messages)-1]
	text, _ := last.Content.(string)
	id := fmt.Sprintf("call_%d", len(req.Messages))
	delta := map[string]any{"role": "assistant"}
	finish := "stop"
	tool := func(name string, args any) {
		a, _ := json.Marshal(args)
		delta["tool_calls"] = []any{map[string]any{"index": 0, "id": id, "type": "function",
			"function": map[string]any{"name": name, "arguments": string(a)}}}
		finish = "tool_calls"
	}
	switch {
	case last.Role == "tool":
		delta["content"] = "tool said: " + text
	case strings.HasPrefix(text, "remember "):
		tool("add_note", map[string]string{"text": strings.TrimPrefix(text, "remember ")})
	case strings.HasPrefix(text, "fetch "):
		tool("fetch_url", map[string]string{"url": strings.TrimPrefix(text, "fetch ")})
	case text == "what do you remember?":
		tool("list_notes", map[string]string{})
	default:
		delta["content"] = "you said: " + text
	}
	chunks := []any{
		map[string]any{"id": "c", "model": chatModel, "choices": []any{map[string]any{"index": 0, "delta": delta}}},
		map[string]any{"id": "c", "model": chatModel, "choices": []any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finish}}},
		map[string]any{"id": "c", "model": chatModel, "choices": []any{},
			"usage": map[string]any{"prompt_tokens": chars/4 + len(req.Messages), "completion_tokens": 7}},
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, c := range chunks {
		b, _ := json.Marshal(c)
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// chatRig is a host running the chat agents against a scripted model
// server and a web page they may fetch.
type chatRig struct {
	*world
	model *modelServer
	page  string // the page's URL
	// pageHits counts the requests the page's server answered.
	pageHits *atomic.Int32
}

// startChatHost starts a host whose executor has the model endpoint
// "chat" on a modelServer, its key in the secret "chat_key", and grants
// the chat agents that endpoint and GET on the page's server.
func startChatHost(t *testing.T) *chatRig {
	t.Helper()
	return startChatHostWith(t, newModelServer(t))
}

// startChatHostWith is startChatHost with a given model server; tweaks
// change the chat agents' capabilities.
func startChatHostWith(t *testing.T, model *modelServer, tweaks ...func(*calls.Capabilities)) *chatRig {
	t.Helper()
	hits := new(atomic.Int32)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, pageBody)
	}))
	t.Cleanup(page.Close)
	pu, err := url.Parse(page.URL)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(pu.Port())
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := calls.NewSecrets(calls.SecretsConfig{
		Declared: map[string]calls.SecretSource{"chat_key": {Env: "CHAT_API_KEY"}},
		LookupEnv: func(name string) (string, bool) {
			if name == "CHAT_API_KEY" {
				return chatKey, true
			}
			return "", false
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ep := calls.Endpoint{Provider: calls.ProviderOpenAI, BaseURL: model.URL + "/v1", Models: []string{chatModel}, Secret: "chat_key"}
	if model.anthropic {
		ep.Provider, ep.BaseURL = calls.ProviderAnthropic, model.URL
	}
	x := newExecutor(t, calls.Config{
		Endpoints: map[string]calls.Endpoint{chat.Endpoint: ep},
		Secrets:   secrets,
	})
	caps := calls.Capabilities{
		Models: []string{chat.Endpoint},
		// An IP literal names its (loopback) address explicitly.
		HTTP:   []calls.HTTPRule{{Scheme: "http", Host: pu.Hostname(), Port: port, Methods: []string{"GET"}}},
		Limits: calls.Limits{CallsPerTurn: 8, TokensPerTurn: 100000},
	}
	for _, tweak := range tweaks {
		tweak(&caps)
	}
	w := startHostOpts(t, filepath.Join(t.TempDir(), "paddock.db"),
		hostOpts{turnTimeout: 30 * time.Second, calls: x, chat: true, chatCaps: caps})
	return &chatRig{world: w, model: model, page: page.URL + "/page", pageHits: hits}
}

// newExecutor returns the real host-call executor for cfg, logging
// nowhere.
func newExecutor(t testing.TB, cfg calls.Config) *calls.Executor {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	x, err := calls.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// chatScript is a conversation with a tool loop in three of its turns:
// a note kept, a page fetched, the notes listed; then a plain answer.
func (r *chatRig) chatScript() []string {
	return []string{"remember buy milk", "fetch " + r.page, "what do you remember?", "thanks"}
}

// run sends msgs to a new session of agent, waits for them, requires every
// event done, and returns the session.
func (w *world) run(agent string, msgs []string) store.ActorKey {
	w.t.Helper()
	key := w.session(agent)
	for _, m := range msgs {
		w.send(key, m)
	}
	for _, e := range w.settle(key) {
		if e.Status != store.EventDone {
			w.t.Fatalf("%s: event %d ended %s after %d failed attempts: %s", agent, e.ID, e.Status, e.Attempts, e.LastError)
		}
	}
	return key
}

// transcript returns a session's transcript, one "turn role: content" line
// per message.
func (w *world) transcript(key store.ActorKey) []string {
	w.t.Helper()
	turns, err := w.st.Transcript(context.Background(), store.TranscriptParams{Key: key, Limit: 100})
	if err != nil {
		w.t.Fatal(err)
	}
	var lines []string
	for _, tr := range turns {
		for _, m := range tr.Messages {
			lines = append(lines, fmt.Sprintf("%d %s: %q", tr.TurnNo, m.Role, m.Content))
		}
	}
	return lines
}

// state returns a session's state.
func (w *world) state(key store.ActorKey) []byte {
	w.t.Helper()
	b, err := w.st.SessionState(context.Background(), key)
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

// journal returns the host calls of every event of a session, one line per
// journal row: the event's position in the session (ids differ between
// sessions), seq, kind, destination, request digest, status, error code,
// tokens, set aside.
func (w *world) journal(key store.ActorKey) []string {
	w.t.Helper()
	ctx := context.Background()
	es, err := w.st.ListEvents(ctx, store.ListEventsParams{Key: key, Limit: 100})
	if err != nil {
		w.t.Fatal(err)
	}
	var lines []string
	for i, e := range es {
		rows, err := w.st.HostCalls(ctx, key, e.ID)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, r := range rows {
			lines = append(lines, fmt.Sprintf("event %d seq %d %s %q %s status %d error %q tokens %d/%d set_aside %v",
				i+1, r.Seq, r.Kind, r.Destination, r.RequestDigest, r.Status, r.ErrorCode, r.InputTokens, r.OutputTokens, r.SetAside))
		}
	}
	return lines
}

func TestChatAgentAnswersAConversationWithAToolLoopThroughRealHostCalls(t *testing.T) {
	t.Parallel()
	r := startChatHost(t)
	key := r.run("chat", r.chatScript())

	want := []string{
		"tool said: noted (1)",
		"tool said: status 200\n" + pageBody,
		"tool said: 1. buy milk\n",
		"you said: thanks",
	}
	if got := r.replies(key); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("replies %q, want %q", got, want)
	}
	s, err := chat.DecodeState(r.state(key))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Notes) != 1 || s.Notes[0] != "buy milk" || s.Turns != 4 {
		t.Errorf("state notes %q turns %d, want [buy milk] and 4 turns", s.Notes, s.Turns)
	}
	// The conversation kept: per tool turn the user's message, the model's
	// tool call, the tool's result and the model's answer; then two.
	roles := make([]string, len(s.Messages))
	for i, m := range s.Messages {
		roles[i] = m.Role
	}
	wantRoles := strings.Repeat("user assistant tool assistant ", 3) + "user assistant"
	if strings.Join(roles, " ") != wantRoles {
		t.Fatalf("state conversation roles %q, want %q", roles, wantRoles)
	}
	if tc := s.Messages[1].ToolCalls; len(tc) != 1 || tc[0].Name != "add_note" || string(tc[0].Arguments) != `{"text":"buy milk"}` ||
		s.Messages[2].ToolCallID != tc[0].ID || s.Messages[2].Content != "noted (1)" {
		t.Errorf("first tool exchange = %+v / %+v", s.Messages[1], s.Messages[2])
	}
	if s.Messages[12].Content != "thanks" || s.Messages[13].Content != "you said: thanks" {
		t.Errorf("last exchange = %+v / %+v", s.Messages[12], s.Messages[13])
	}
	if s.Usage.OutputTokens != 7*7 || s.Usage.InputTokens <= 0 {
		t.Errorf("usage %+v, want 49 output tokens over 7 model calls", s.Usage)
	}
	if n := r.model.requests(); n != 7 {
		t.Errorf("the model server answered %d requests, want 7 (each call once: no retry, no replay)", n)
	}

	// The journal: every call recorded once, in order, with its tokens.
	j := r.journal(key)
	kinds := []string{"1 1 model", "1 2 model", "2 1 model", "2 2 http", "2 3 model", "3 1 model", "3 2 model", "4 1 model"}
	if len(j) != len(kinds) {
		t.Fatalf("journal:\n%s\nwant %d rows", strings.Join(j, "\n"), len(kinds))
	}
	var in, out int64
	for i, line := range j {
		var ev, seq, status int
		var kind, dest, digest, errCode, setAside string
		var ti, to int64
		if _, err := fmt.Sscanf(line, "event %d seq %d %s %q %s status %d error %q tokens %d/%d set_aside %s",
			&ev, &seq, &kind, &dest, &digest, &status, &errCode, &ti, &to, &setAside); err != nil {
			t.Fatalf("journal row %q: %v", line, err)
		}
		if fmt.Sprintf("%d %d %s", ev, seq, kind) != kinds[i] || status != 200 || errCode != "" || setAside != "false" ||
			!strings.HasPrefix(digest, "sha256:") {
			t.Errorf("journal row %d = %s, want %s, status 200, no error", i, line, kinds[i])
		}
		switch kind {
		case "model":
			if dest != "model chat/"+chatModel || to != 7 || ti <= 0 {
				t.Errorf("model row %s: want destination model chat/%s and its tokens", line, chatModel)
			}
		case "http":
			if dest != "GET "+r.page || ti != 0 || to != 0 {
				t.Errorf("http row %s: want destination GET %s and no tokens", line, r.page)
			}
		}
		in, out = in+ti, out+to
	}
	if in != s.Usage.InputTokens || out != s.Usage.OutputTokens {
		t.Errorf("journal tokens %d/%d, state usage %+v", in, out, s.Usage)
	}
}

func TestTheChatAgentAsWasmPluginAndRemoteWorkerGivesIdenticalTranscriptsStatesAndJournals(t *testing.T) {
	t.Parallel()
	r := startChatHost(t)
	script := r.chatScript()
	type run struct {
		transcript, journal []string
		state               []byte
	}
	runs := map[string]run{}
	for _, agent := range []string{"chat", "chat-plugin", "chat-remote"} {
		key := r.run(agent, script)
		runs[agent] = run{r.transcript(key), r.journal(key), r.state(key)}
	}
	ref := runs["chat"]
	if len(ref.transcript) != 2*len(script) || len(ref.journal) != 8 || len(ref.state) == 0 {
		t.Fatalf("wasm run: transcript %q, journal %q, state %s", ref.transcript, ref.journal, ref.state)
	}
	for _, kind := range []string{"chat-plugin", "chat-remote"} {
		got := runs[kind]
		if strings.Join(got.transcript, "\n") != strings.Join(ref.transcript, "\n") {
			t.Errorf("transcripts differ\nwasm:\n%s\n\n%s:\n%s", strings.Join(ref.transcript, "\n"), kind, strings.Join(got.transcript, "\n"))
		}
		if string(got.state) != string(ref.state) {
			t.Errorf("states differ:\nwasm %s\n%s %s", ref.state, kind, got.state)
		}
		if strings.Join(got.journal, "\n") != strings.Join(ref.journal, "\n") {
			t.Errorf("journals differ\nwasm:\n%s\n\n%s:\n%s", strings.Join(ref.journal, "\n"), kind, strings.Join(got.journal, "\n"))
		}
	}
	if n := r.model.requests(); n != 3*7 {
		t.Errorf("the model server answered %d requests, want 21 (7 per kind)", n)
	}
}

func TestChatAgentWithoutAModelRepliesWithTheSetupAndTheEventIsDone(t *testing.T) {
	t.Parallel()
	caps := calls.Capabilities{Models: []string{chat.Endpoint}}
	cases := []struct {
		name string
		cfg  calls.Config
		// why is what the reply must say was wrong.
		why string
	}{
		{"no endpoint", calls.Config{}, `model endpoint "chat" is not configured on this host`},
		{"endpoint key unset", calls.Config{
			Endpoints: map[string]calls.Endpoint{chat.Endpoint: {Provider: calls.ProviderOpenAI,
				BaseURL: "http://127.0.0.1:9/v1", Models: []string{chatModel}, Secret: "chat_key"}},
			Secrets: mustSecrets(t, calls.SecretsConfig{
				Declared:  map[string]calls.SecretSource{"chat_key": {Env: "CHAT_API_KEY"}},
				LookupEnv: func(string) (string, bool) { return "", false },
			}),
		}, "environment variable CHAT_API_KEY is not set"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := startHostOpts(t, filepath.Join(t.TempDir(), "paddock.db"),
				hostOpts{turnTimeout: 30 * time.Second, calls: newExecutor(t, c.cfg), chat: true, chatCaps: caps})
			key := w.session("chat")
			w.send(key, "hello")
			w.send(key, "hello again")
			for _, e := range w.settle(key) {
				if e.Status != store.EventDone || e.Attempts != 0 {
					t.Fatalf("event %d ended %s after %d failed attempts (%q), want done at the first", e.ID, e.Status, e.Attempts, e.LastError)
				}
			}
			for _, reply := range w.replies(key) {
				if !strings.HasPrefix(reply, "(no model is configured for this agent: ") || !strings.Contains(reply, c.why) ||
					!strings.Contains(reply, chat.Setup) {
					t.Errorf("reply %q, want the setup hint and %q", reply, c.why)
				}
			}
			s, err := chat.DecodeState(w.state(key))
			if err != nil {
				t.Fatal(err)
			}
			// The questions stay in the conversation; the failures are not
			// kept as the model's words.
			if s.Turns != 2 || len(s.Messages) != 2 || s.Messages[0].Content != "hello" || s.Messages[1].Role != abi.RoleUser {
				t.Errorf("state %+v, want two turns and the two user messages", s)
			}
			j := w.journal(key)
			if len(j) != 2 {
				t.Fatalf("journal %q, want one refused call per event", j)
			}
			for _, line := range j {
				if !strings.Contains(line, `model "model chat`) || !strings.Contains(line, `error "not_configured"`) {
					t.Errorf("journal row %s, want a model call to chat answered not_configured", line)
				}
			}
		})
	}
}

// mustSecrets returns the secrets of cfg.
func mustSecrets(t testing.TB, cfg calls.SecretsConfig) *calls.Secrets {
	t.Helper()
	s, err := calls.NewSecrets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAChatTurnRetriedAfterItsPluginProcessDiedReplaysTheModelCallsItAlreadyMade(t *testing.T) {
	t.Parallel()
	// The turn's second model call (the answer after add_note) is held;
	// meanwhile its plugin process is killed.
	model := &modelServer{holdAt: 2, held: make(chan struct{}), aborted: make(chan struct{})}
	model.Server = httptest.NewServer(http.HandlerFunc(model.serve))
	t.Cleanup(model.Close)
	r := startChatHostWith(t, model)
	key := r.session("chat-plugin")
	r.send(key, "remember buy milk")
	select {
	case <-model.held:
	case <-time.After(time.Minute):
		t.Fatal("the turn's second model call never came")
	}
	st, err := r.plugins.Status("chat-plugin")
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, p := range st.Processes {
		if p.Turns > 0 && !p.Retired {
			if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("killed %d plugin processes, want the one running the turn (%+v)", killed, st.Processes)
	}
	e := r.settle(key)[0]
	if e.Status != store.EventDone || e.Attempts != 1 || !strings.Contains(e.LastError, "crash") {
		t.Fatalf("event %s after %d failed attempts (%q), want done after 1 crash", e.Status, e.Attempts, e.LastError)
	}
	// The dead attempt's call in flight was abandoned by the host, not
	// left to run on.
	select {
	case <-model.aborted:
	case <-time.After(10 * time.Second):
		t.Error("the held model call of the dead attempt was not aborted")
	}
	if got := r.replies(key); len(got) != 1 || got[0] != "tool said: noted (1)" {
		t.Errorf("replies %q, want the turn once, answered", got)
	}
	s, err := chat.DecodeState(r.state(key))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Notes) != 1 || s.Turns != 1 || len(s.Messages) != 4 {
		t.Errorf("state %+v, want one note, one turn, one tool exchange", s)
	}
	// The first call was paid once: the retry replayed it. The held one
	// was sent again (a call without a recorded answer is never replayed).
	if n := model.requests(); n != 3 {
		t.Errorf("the model server answered %d requests, want 3 (call 1 once, call 2 twice)", n)
	}
	rows, err := r.st.HostCalls(context.Background(), key, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	var live []store.HostCall
	for _, row := range rows {
		if !row.SetAside {
			live = append(live, row)
		}
	}
	if len(live) != 2 || live[0].Seq != 1 || live[0].Replays != 1 || live[0].ErrorCode != "" ||
		live[1].Seq != 2 || live[1].ErrorCode != "" || live[1].Replays != 0 || live[1].Status != 200 {
		t.Errorf("journal %+v, want seq 1 replayed once and seq 2 answered live", rows)
	}
}

// serveAnthropic answers as modelServer.serve does, in Anthropic's
// Messages API (POST /v1/messages, streamed; the key in x-api-key).
func (m *modelServer) serveAnthropic(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/messages" || r.Method != http.MethodPost {
		http.Error(w, `{"type":"error","error":{"type":"not_found_error","message":"not found"}}`, http.StatusNotFound)
		return
	}
	if r.Header.Get("x-api-key") != chatKey || r.Header.Get("anthropic-version") == "" {
		http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"bad key"}}`, http.StatusUnauthorized)
		return
	}
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		System   string `json:"system"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 || !req.Stream || req.Model != chatModel || req.System == "" {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	// The last message's text, or the result of the tool it answers.
	last := req.Messages[len(req.Messages)-1]
	var text, toolResult string
	isTool := false
	if err := json.Unmarshal(last.Content, &text); err != nil {
		var blocks []struct {
			Type    string `json:"type"`
			Text    string `json:"text"`
			Content any    `json:"content"`
		}
		_ = json.Unmarshal(last.Content, &blocks)
		for _, b := range blocks {
			switch b.Type {
			case "text":
				text = b.Text
			case "tool_result":
				isTool = true
				toolResult, _ = b.Content.(string)
			}
		}
	}
	id := fmt.Sprintf("toolu_%d", len(req.Messages))
	var block map[string]any
	var input any
	stop := "end_turn"
	tool := func(name string, args any) {
		block = map[string]any{"type": "tool_use", "id": id, "name": name, "input": map[string]any{}}
		input, stop = args, "tool_use"
	}
	switch {
	case isTool:
		block = map[string]any{"type": "text", "text": ""}
		input = "tool said: " + toolResult
	case strings.HasPrefix(text, "remember "):
		tool("add_note", map[string]string{"text": strings.TrimPrefix(text, "remember ")})
	case strings.HasPrefix(text, "fetch "):
		tool("fetch_url", map[string]string{"url": strings.TrimPrefix(text, "fetch ")})
	case text == "what do you remember?":
		tool("list_notes", map[string]string{})
	default:
		block = map[string]any{"type": "text", "text": ""}
		input = "you said: " + text
	}
	var delta map[string]any
	if s, ok := input.(string); ok {
		delta = map[string]any{"type": "text_delta", "text": s}
	} else {
		a, _ := json.Marshal(input)
		delta = map[string]any{"type": "input_json_delta", "partial_json": string(a)}
	}
	events := []struct {
		typ  string
		data any
	}{
		{"message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg", "type": "message", "role": "assistant",
			"model": chatModel, "content": []any{}, "usage": map[string]any{"input_tokens": 10 * len(req.Messages), "output_tokens": 1}}}},
		{"content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": block}},
		{"content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": delta}},
		{"content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}},
		{"message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop}, "usage": map[string]any{"output_tokens": 7}}},
		{"message_stop", map[string]any{"type": "message_stop"}},
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events {
		b, _ := json.Marshal(e.data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.typ, b)
	}
}

func TestChatAgentOnAnAnthropicEndpoint(t *testing.T) {
	t.Parallel()
	model := &modelServer{anthropic: true, held: make(chan struct{}), aborted: make(chan struct{})}
	model.Server = httptest.NewServer(http.HandlerFunc(model.serve))
	t.Cleanup(model.Close)
	r := startChatHostWith(t, model)
	key := r.run("chat", []string{"remember buy milk", "what do you remember?", "thanks"})
	want := []string{"tool said: noted (1)", "tool said: 1. buy milk\n", "you said: thanks"}
	if got := r.replies(key); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("replies %q, want %q", got, want)
	}
	s, err := chat.DecodeState(r.state(key))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Notes) != 1 || s.Notes[0] != "buy milk" || len(s.Messages) != 10 || s.Usage.OutputTokens != 5*7 {
		t.Errorf("state %+v, want the note, 10 messages and 35 output tokens over 5 calls", s)
	}
	if tc := s.Messages[1].ToolCalls; len(tc) != 1 || tc[0].ID != "toolu_1" || tc[0].Name != "add_note" {
		t.Errorf("tool call %+v, want add_note with the server's id toolu_1 (the system prompt travels apart)", s.Messages[1])
	}
	j := r.journal(key)
	if len(j) != 5 {
		t.Fatalf("journal %q, want 5 model calls", j)
	}
	for _, line := range j {
		if !strings.Contains(line, `model "model chat/`+chatModel+`"`) || !strings.Contains(line, `status 200 error ""`) {
			t.Errorf("journal row %s, want a model call answered 200", line)
		}
	}
}
