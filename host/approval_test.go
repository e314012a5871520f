package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
)

// approvalToken is the secret value the approval tests plant: it must
// never show in a wait.
const approvalToken = "tok-approval-planted-3141"

// countingServer answers GET /a with "A" and POST /b with "B" and counts
// the requests by path.
type countingServer struct {
	*httptest.Server
	mu sync.Mutex
	n  map[string]int
}

func newCountingServer(t *testing.T) *countingServer {
	s := &countingServer{n: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.n[r.Method+" "+r.URL.Path]++
		s.mu.Unlock()
		_, _ = io.WriteString(w, strings.ToUpper(strings.TrimPrefix(r.URL.Path, "/")))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *countingServer) count(req string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[req]
}

// startWithApprovals runs a host whose agents may GET and POST the
// server, with POSTs under /b needing approval, and a secret TOKEN they
// may put in headers.
func startWithApprovals(t *testing.T, st store.Store, funcs map[string]abi.TurnFunc, srv *countingServer, timeout time.Duration) *fixture {
	t.Helper()
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	secrets, err := calls.NewSecrets(calls.SecretsConfig{
		Declared:  map[string]calls.SecretSource{"TOKEN": {Env: "APPROVAL_TOKEN"}},
		LookupEnv: func(string) (string, bool) { return approvalToken, true },
	})
	if err != nil {
		t.Fatal(err)
	}
	x, err := calls.New(calls.Config{Secrets: secrets, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	pol := testPolicy()
	pol.Capabilities = calls.Capabilities{
		HTTP:    []calls.HTTPRule{{Scheme: "http", Host: "127.0.0.1", Port: port, Methods: []string{"GET", "POST"}}},
		Secrets: []string{"TOKEN"},
		Approval: calls.ApprovalRules{HTTP: []calls.ApprovalHTTPRule{{Host: "127.0.0.1", Methods: []string{"POST"}, PathPrefix: "/b"}},
			Timeout: timeout},
	}
	return runHost(t, host.Options{Store: st, Runner: funcRunner{funcs}, Policy: pol, Logger: quietLogger(), Calls: x})
}

// payTurn GETs /a, then POSTs /b with the secret in a header, and replies
// with what each call gave.
func payTurn(base string) abi.TurnFunc {
	return func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
		describe := func(r *abi.HTTPResponse, err error) string {
			var ce *abi.CallError
			if errors.As(err, &ce) {
				return fmt.Sprintf("%s/%s: %s", ce.Code, ce.Reason, ce.Message)
			}
			if err != nil {
				return err.Error()
			}
			return string(r.Body)
		}
		a := describe(abi.CallHTTP(ctx, &abi.HTTPRequest{URL: base + "/a"}))
		b := describe(abi.CallHTTP(ctx, &abi.HTTPRequest{Method: "POST", URL: base + "/b",
			Headers: map[string]string{"Authorization": "Bearer {{secret:TOKEN}}"}, Body: []byte(`{"amount":5}`)}))
		if err := ctx.Err(); err != nil {
			return nil, err // held: the host drops this attempt's result
		}
		return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "a=" + a + " b=" + b}}}, nil
	}
}

// heldWait waits until the session is asleep for an approval and returns
// the approval wait.
func (f *fixture) heldWait(key store.ActorKey) store.Wait {
	f.t.Helper()
	var w store.Wait
	f.waitFor("the turn to hold for an approval", func() bool {
		pg, err := f.st.ListWaits(context.Background(), store.ListWaitsParams{AgentUID: key.AgentUID, SessionID: key.SessionID, Status: store.WaitOpen})
		if err != nil {
			f.t.Fatal(err)
		}
		if len(pg.Waits) == 0 {
			return false
		}
		w = pg.Waits[0]
		s := f.get(key)
		return s.Status == store.SessionSleeping
	})
	return w
}

// TestACallNeedingApprovalHoldsTheTurnUntilDecided: call A goes out, call
// B needs approval: the attempt ends as a hold (not counted), the session
// sleeps for the approval, and the wait shows B's request with its
// secret placeholder unfilled. Approved, the turn runs again: A is
// replayed from the journal (the server saw it once), B goes out exactly
// once, and the turn commits. Rejected, the agent's call B answers denied
// (reason approval) with the approver's reason, and B never goes out.
func TestACallNeedingApprovalHoldsTheTurnUntilDecided(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newCountingServer(t)
		f := startWithApprovals(t, st, map[string]abi.TurnFunc{"pay": payTurn(srv.URL)}, srv, 0)
		a := f.agent("pay")

		key := f.session(a)
		ev := f.signal(key, "pay")
		w := f.heldWait(key)
		if s := f.get(key); s.SleepReason != store.SleepReasonApproval {
			t.Errorf("sleep reason %q, want approval", s.SleepReason)
		}
		if w.Kind != store.WaitKindApproval || w.EventID != ev.ID || w.CallSeq != 2 || !strings.HasPrefix(w.CallDigest, "sha256:") ||
			w.ID != fmt.Sprintf("approval-%d-2", ev.ID) || w.For != "approve POST "+srv.URL+"/b" {
			t.Errorf("approval wait = %+v", w)
		}
		var shown abi.CallRequest
		if err := json.Unmarshal(w.Data, &shown); err != nil || shown.HTTP == nil || shown.HTTP.Headers["Authorization"] != "Bearer {{secret:TOKEN}}" ||
			string(shown.HTTP.Body) != `{"amount":5}` {
			t.Errorf("wait data %s (%v): want the request with its placeholder unfilled", w.Data, err)
		}
		if strings.Contains(string(w.Data), approvalToken) || strings.Contains(w.For, approvalToken) {
			t.Fatal("the approval wait shows the secret's value")
		}
		if e := f.events(key)[0]; e.Status != store.EventOpen || e.Attempts != 0 {
			t.Errorf("held event: %s after %d counted attempts, want open and none counted", e.Status, e.Attempts)
		}
		if srv.count("GET /a") != 1 || srv.count("POST /b") != 0 {
			t.Errorf("before the decision: GET /a %d, POST /b %d; want 1 and 0", srv.count("GET /a"), srv.count("POST /b"))
		}
		kinds, _ := describeStream(t, f.frames(key))
		if got := strings.Join(kinds, " "); !strings.HasSuffix(got, "turn.retrying#1 wait.opened#1") && !strings.HasSuffix(got, "turn.retrying#1 wait.opened#0") {
			t.Errorf("frames %s: want turn.retrying then wait.opened at the end", got)
		}

		if _, err := st.ResolveWait(context.Background(), store.ResolveWaitParams{Key: key, WaitID: w.ID, Resolution: json.RawMessage(`{"approved":true}`)}); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(key)
		f.waitFor("the approved turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		turns := f.transcript(key)
		if got := turns[0].Messages[len(turns[0].Messages)-1].Content; got != "a=A b=B" {
			t.Errorf("reply %q, want a=A b=B", got)
		}
		if srv.count("GET /a") != 1 || srv.count("POST /b") != 1 {
			t.Errorf("after approval: GET /a %d (want 1: replayed), POST /b %d (want 1)", srv.count("GET /a"), srv.count("POST /b"))
		}
		rows := f.journal(key, ev.ID)
		if len(rows) != 2 || rows[0].Replays != 1 || rows[1].Seq != 2 || rows[1].ErrorCode != "" || rows[1].Status != 200 {
			t.Errorf("journal %+v: want A replayed once and B live at seq 2", rows)
		}

		// Rejected.
		key = f.session(a)
		ev = f.signal(key, "pay")
		w = f.heldWait(key)
		if _, err := st.ResolveWait(context.Background(), store.ResolveWaitParams{Key: key, WaitID: w.ID,
			Resolution: json.RawMessage(`{"approved":false,"reason":"too risky"}`)}); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(key)
		f.waitFor("the rejected turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		turns = f.transcript(key)
		if got, want := turns[0].Messages[len(turns[0].Messages)-1].Content, "a=A b=denied/approval: the approver rejected this call: too risky"; got != want {
			t.Errorf("reply %q, want %q", got, want)
		}
		if srv.count("GET /a") != 2 || srv.count("POST /b") != 1 {
			t.Errorf("after rejection: GET /a %d (want 2: one per session), POST /b %d (want still 1)", srv.count("GET /a"), srv.count("POST /b"))
		}
		rows = f.journal(key, ev.ID)
		if len(rows) != 2 || rows[1].ErrorCode != string(abi.CallDenied) {
			t.Errorf("journal %+v: want B recorded denied", rows)
		}
	})
}

// TestAnApprovalNoOneDecidesExpiresIntoADenial: with approval.timeout
// set, an undecided approval expires (the host's scan), the held event
// runs again, and the call answers denied (reason approval) without
// going out.
func TestAnApprovalNoOneDecidesExpiresIntoADenial(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newCountingServer(t)
		f := startWithApprovals(t, st, map[string]abi.TurnFunc{"pay": payTurn(srv.URL)}, srv, time.Millisecond)
		key := f.session(f.agent("pay"))
		ev := f.signal(key, "pay")
		f.waitFor("the expired approval's turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		turns := f.transcript(key)
		if got, want := turns[0].Messages[len(turns[0].Messages)-1].Content, "a=A b=denied/approval: the approval of this call expired before anyone decided"; got != want {
			t.Errorf("reply %q, want %q", got, want)
		}
		if srv.count("GET /a") != 1 || srv.count("POST /b") != 0 {
			t.Errorf("GET /a %d (want 1), POST /b %d (want 0)", srv.count("GET /a"), srv.count("POST /b"))
		}
		w, err := st.GetWait(context.Background(), key, fmt.Sprintf("approval-%d-2", ev.ID))
		if err != nil || w.Status != store.WaitExpired {
			t.Errorf("approval wait %+v, %v: want expired", w, err)
		}
	})
}
