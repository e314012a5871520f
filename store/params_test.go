package store

import (
	"errors"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

func TestPageLimit(t *testing.T) {
	for n, want := range map[int]int{-1: DefaultPageLimit, 0: DefaultPageLimit, 1: 1, MaxPageLimit: MaxPageLimit, MaxPageLimit + 1: MaxPageLimit} {
		if got := PageLimit(n); got != want {
			t.Errorf("PageLimit(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestValidation(t *testing.T) {
	if err := CheckLeaseTTL(0); !errors.Is(err, ErrInvalid) {
		t.Errorf("CheckLeaseTTL(0) = %v", err)
	}
	if err := CheckLeaseTTL(time.Millisecond); err != nil {
		t.Errorf("CheckLeaseTTL(1ms) = %v", err)
	}
	for _, c := range []struct {
		p    CreateAgentParams
		want string
	}{
		{CreateAgentParams{CrashPolicy: CrashRestart}, KindWasm},
		{CreateAgentParams{Kind: KindPlugin, Plugin: "p", CrashPolicy: CrashSleep}, KindPlugin},
		{CreateAgentParams{Kind: KindWasm, Plugin: "p", CrashPolicy: CrashSleep}, ""},
		{CreateAgentParams{Kind: KindPlugin, ModuleDigest: "sha256:x", CrashPolicy: CrashSleep}, ""},
		{CreateAgentParams{Kind: "fabric", CrashPolicy: CrashSleep}, ""},
		{CreateAgentParams{CrashPolicy: "reboot"}, ""},
	} {
		got, err := AgentKind(c.p)
		if got != c.want || (c.want == "") != errors.Is(err, ErrInvalid) {
			t.Errorf("AgentKind(%+v) = %q, %v; want %q", c.p, got, err, c.want)
		}
	}
	if env, err := PluginEnv(PluginWorker{Name: "p", Processes: 1}); env != "{}" || err != nil {
		t.Errorf("PluginEnv(nil env) = %q, %v", env, err)
	}
	if _, err := PluginEnv(PluginWorker{Name: "p"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PluginEnv(0 processes) = %v", err)
	}
}

func TestTurnMessagesAndAlarms(t *testing.T) {
	got := TurnMessages([]string{`{"message":"hi"}`, `{"data":{}}`, `{"message":"steer"}`, `not json`},
		[]abi.Message{{Role: abi.RoleAssistant, Content: "yo"}})
	want := []TranscriptMessage{{0, abi.RoleUser, "hi"}, {1, abi.RoleUser, "steer"}, {2, abi.RoleAssistant, "yo"}}
	if len(got) != len(want) {
		t.Fatalf("TurnMessages = %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("TurnMessages[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	due := time.UnixMilli(1_700_000_000_123).In(time.FixedZone("x", 3600))
	for data, want := range map[string]string{
		"":         `{"alarm":{"name":"a","due_at":"2023-11-14T22:13:20.123Z"}}`,
		`{"k":1}`:  `{"alarm":{"name":"a","due_at":"2023-11-14T22:13:20.123Z","data":{"k":1}}}`,
		`not json`: `{"alarm":{"name":"a","due_at":"2023-11-14T22:13:20.123Z","data":"not json"}}`,
	} {
		if got, err := AlarmPayload("a", due, data); got != want || err != nil {
			t.Errorf("AlarmPayload(%q) = %s, %v; want %s", data, got, err, want)
		}
	}
	if k := AlarmIdempotencyKey("a", due); k != "alarm:a:1700000000123" {
		t.Errorf("AlarmIdempotencyKey = %q", k)
	}
	key := ActorKey{AgentUID: "a", SessionID: "s"}
	if err := NotDeadLetter(key, 1, ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("NotDeadLetter(missing) = %v", err)
	}
	var nd *NotDeadLetterError
	if err := NotDeadLetter(key, 1, EventDone); !errors.As(err, &nd) || !errors.Is(err, ErrConflict) || nd.Status != EventDone {
		t.Errorf("NotDeadLetter(done) = %v", err)
	}
}

func TestPlanAlarmOps(t *testing.T) {
	w, err := PlanAlarmOps([]abi.AlarmOp{
		{Name: "b", InMs: -5, EveryMs: -1, Data: []byte("null")},
		{Name: "a", Clear: true},
		{Name: "c", InMs: 10},
		{Name: "a", InMs: 1, Data: []byte(`{"k":1}`)},
		{Name: "c", Clear: true},
	})
	if err != nil {
		t.Fatalf("PlanAlarmOps: %v", err)
	}
	if _, err := PlanAlarmOps([]abi.AlarmOp{{Name: "x", Data: []byte("{")}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PlanAlarmOps(bad data) = %v, want ErrInvalid", err)
	}
	if len(w.Clear) != 1 || w.Clear[0] != "c" {
		t.Errorf("Clear = %v, want [c]", w.Clear)
	}
	if len(w.Set) != 2 || w.Set[0].Name != "a" || w.Set[1].Name != "b" {
		t.Fatalf("Set = %+v, want a then b", w.Set)
	}
	if b := w.Set[1]; b.InMs != 0 || b.EveryMs != 0 || b.Data != nil {
		t.Errorf("b = %+v, want clamped, no data", b)
	}
	if string(w.Set[0].Data) != `{"k":1}` {
		t.Errorf("a's data = %s", w.Set[0].Data)
	}
}
