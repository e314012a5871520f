package pluginhost_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/plugins/plugintest"
)

// Test plugin packages.
const (
	agentPkg      = "./plugins/internal/testplugins/agent"
	badVersionPkg = "./plugins/internal/testplugins/badversion"
	garbagePkg    = "./plugins/internal/testplugins/garbage"
	silentPkg     = "./plugins/internal/testplugins/silent"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		helperHost()
		return
	}
	code := m.Run()
	if dir, err := plugintest.Dir(); err == nil {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}

// logBuf is a concurrency-safe buffer for a test's log.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newManager returns a Manager logging at debug into the returned buffer,
// closed at the end of the test (and its log printed if the test failed).
func newManager(t *testing.T, opts pluginhost.Options) (*pluginhost.Manager, *logBuf) {
	t.Helper()
	buf := &logBuf{}
	log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := pluginhost.NewManager(log, opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
		if t.Failed() || os.Getenv("PLUGINS_TEST_LOG") != "" {
			t.Logf("manager log:\n%s", buf.String())
		}
	})
	return m, buf
}

// register builds pkg and registers it as name, with cfg's other fields.
func register(t *testing.T, m *pluginhost.Manager, name, pkg string, cfg pluginhost.Config) (path, sum string) {
	t.Helper()
	path, sum = plugintest.Build(t, pkg)
	cfg.Name, cfg.Path, cfg.SHA256 = name, path, sum
	if err := m.Register(context.Background(), cfg); err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	return path, sum
}

func instance(t *testing.T, m *pluginhost.Manager, name string) *pluginhost.Instance {
	t.Helper()
	inst, err := m.Instance(context.Background(), name, "")
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// request returns a turn request for msg with event id ev.
func request(msg string, ev int64, state []byte) *abi.TurnRequest {
	return &abi.TurnRequest{
		ABIVersion: abi.Version,
		TurnRef: abi.TurnRef{DeliveryID: fmt.Sprintf("d%d", ev), ActivationUID: "act-1", ActorEpoch: 1,
			ActorEventID: ev, AgentUID: "agt", SessionID: "s1"},
		Session: abi.Session{AgentName: "test", SessionID: "s1"},
		Event:   abi.Event{ID: ev, Kind: abi.EventMessage, Message: msg, AcceptedAt: time.Now().UTC()},
		State:   state,
		Attempt: 1,
	}
}

// reply runs msg and returns the reply text.
func reply(t *testing.T, inst *pluginhost.Instance, msg string) string {
	t.Helper()
	res, err := inst.Turn(context.Background(), request(msg, 1, nil))
	if err != nil {
		t.Fatalf("turn %q: %v", msg, err)
	}
	if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 {
		t.Fatalf("turn %q: outcome %s (%s), %d messages", msg, res.Outcome, res.Error, len(res.Messages))
	}
	return res.Messages[0].Content
}

// turnError asserts err is a *pluginhost.TurnError of kind and returns it.
func turnError(t *testing.T, err error, kind string) *pluginhost.TurnError {
	t.Helper()
	var te *pluginhost.TurnError
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a *pluginhost.TurnError", err, err)
	}
	if te.Kind != kind {
		t.Fatalf("kind %q, want %q: %v", te.Kind, kind, err)
	}
	return te
}

// processGone reports whether pid no longer runs (absent, or a zombie
// nobody reaped).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] == 'Z'
}

// waitGone waits up to d for pid to be gone.
func waitGone(t *testing.T, pid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs %s later", pid, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitTurns waits until plugin name has n turns running on its processes
// and returns the pid of the first process running any.
func waitTurns(t *testing.T, m *pluginhost.Manager, name string, n int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := m.Status(name)
		if err != nil {
			t.Fatal(err)
		}
		total, pid := 0, 0
		for _, p := range st.Processes {
			total += p.Turns
			if p.Turns > 0 && pid == 0 {
				pid = p.PID
			}
		}
		if total >= n {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin %s: %d turns running, want %d", name, total, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// figure records a measured figure: logged, and appended to the file named
// by FIGURES_FILE (make test prints it at the end).
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	if path := os.Getenv("FIGURES_FILE"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
}
