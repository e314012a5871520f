package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// TestRunnableSessionsReadsOnlySessionsWithOpenEvents: the runnable scan,
// which every host runs each ScanInterval, finds the sessions with work
// among idle ones (awake, nothing open) by walking the open events: its
// plan scans no table whole, sessions included (it had scanned every
// session for its oldest open event).
func TestRunnableSessionsReadsOnlySessionsWithOpenEvents(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "runnable.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	m, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "sha256:runnable", ABIVersion: abi.Version, Bytes: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "runnable", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 60 {
		ss, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: fmt.Sprintf("s%02d", i), CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		if i%20 != 7 {
			continue // idle: no open event
		}
		for j := range 2 {
			if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: ss.ActorKey, Kind: abi.EventMessage, Payload: []byte(fmt.Sprintf(`{"message":"%d"}`, j))}); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, ss.SessionID)
	}
	keys, err := s.RunnableSessions(ctx, store.RunnableSessionsParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range keys {
		got = append(got, k.SessionID)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("runnable sessions %v, want %v", got, want)
	}
	rows, err := s.r.QueryContext(ctx, `EXPLAIN QUERY PLAN `+runnableSessionsSQL, `[]`, 10, `["capacity"]`, `[]`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	// "SCAN <table or alias>" without an index is a whole scan; the
	// recursive CTE's own rows (k), its constant row and json_each are
	// not tables. A search of sessions by status would be every awake
	// session.
	whole := regexp.MustCompile(`^SCAN (\w+)( |$)`)
	for _, d := range plan {
		if strings.Contains(d, "sessions_browse_status") {
			t.Errorf("the runnable scan's plan reads the sessions by status: %q\nplan:\n%s", d, strings.Join(plan, "\n"))
		}
		if m := whole.FindStringSubmatch(d); m != nil && m[1] != "k" && m[1] != "CONSTANT" && !strings.Contains(d, "USING") && !strings.Contains(d, "json_each") {
			t.Errorf("the runnable scan's plan reads a table whole: %q\nplan:\n%s", d, strings.Join(plan, "\n"))
		}
	}
}
