package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// The writer's group commit (groupwrite.go), driven group by group.

func groupStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "group.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// auditWrite is a write that inserts one audit row with object obj, then
// fails with fail when it is set.
func auditWrite(obj string, fail error) func(tx *txn) error {
	return func(tx *txn) error {
		if _, err := tx.exec(`INSERT INTO audit_log (at, token_id, namespace, action, object, result, status)
			VALUES (0, 't', '', 'a', ?, 'ok', 200)`, obj); err != nil {
			return err
		}
		return fail
	}
}

func auditObjects(t *testing.T, s *Store) []string {
	t.Helper()
	rows, err := s.r.Query(`SELECT object FROM audit_log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

// TestGroupWriteIsolatesEachWrite: in one group, a write that fails after
// writing has its writes rolled back and gets its own error; the writes
// before and after it commit; a write whose caller gave up before the
// group ran is not run.
func TestGroupWriteIsolatesEachWrite(t *testing.T) {
	s := groupStore(t)
	refused := errors.New("refused by the write")
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	reqs := []*writeReq{
		{ctx: context.Background(), op: "first", fn: auditWrite("first", nil)},
		{ctx: context.Background(), op: "failing", fn: auditWrite("failing", refused)},
		{ctx: gone, op: "gone", fn: auditWrite("gone", nil)},
		{ctx: context.Background(), op: "last", fn: auditWrite("last", nil)},
	}
	for _, r := range reqs {
		r.done = make(chan error, 1)
	}
	s.writeGroup(reqs)
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = <-r.done
	}
	if errs[0] != nil || errs[3] != nil || !errors.Is(errs[1], refused) || !strings.Contains(errs[1].Error(), "failing") ||
		!errors.Is(errs[2], context.Canceled) {
		t.Fatalf("answers %v", errs)
	}
	if got := auditObjects(t, s); fmt.Sprint(got) != "[first last]" {
		t.Fatalf("committed %v, want [first last]", got)
	}
}

// TestGroupWriteFailsWholeOnABrokenTransaction: when a write's error
// leaves no transaction to roll back to (here the write ends it itself),
// nothing of the group commits and every write of it returns an error.
func TestGroupWriteFailsWholeOnABrokenTransaction(t *testing.T) {
	s := groupStore(t)
	reqs := []*writeReq{
		{ctx: context.Background(), op: "first", fn: auditWrite("first", nil)},
		{ctx: context.Background(), op: "breaker", fn: func(tx *txn) error {
			if _, err := tx.tx.ExecContext(tx.ctx, `ROLLBACK`); err != nil {
				return err
			}
			return errors.New("broke the transaction")
		}},
		{ctx: context.Background(), op: "last", fn: auditWrite("last", nil)},
	}
	for _, r := range reqs {
		r.done = make(chan error, 1)
	}
	s.writeGroup(reqs)
	for _, r := range reqs {
		if err := <-r.done; err == nil || !strings.Contains(err.Error(), "group commit") {
			t.Errorf("%s: %v, want the group's error", r.op, err)
		}
	}
	if got := auditObjects(t, s); len(got) != 0 {
		t.Fatalf("committed %v, want nothing", got)
	}
	// The writer is usable afterwards.
	if err := s.write(context.Background(), "after", auditWrite("after", nil)); err != nil {
		t.Fatal(err)
	}
	if got := auditObjects(t, s); fmt.Sprint(got) != "[after]" {
		t.Fatalf("committed %v, want [after]", got)
	}
}

// TestGroupWriteOfConcurrentAppends: concurrent appends to many sessions
// share transactions, and every session's events are contiguous, in each
// sender's order.
func TestGroupWriteOfConcurrentAppends(t *testing.T) {
	ctx := context.Background()
	s := groupStore(t)
	m, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "sha256:group", ABIVersion: abi.Version, Bytes: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: "00000000-0000-4000-8000-000000000001", Name: "group", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	const senders, each = 16, 30
	var wg sync.WaitGroup
	keys := make([]store.ActorKey, senders)
	for i := range keys {
		ss, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: fmt.Sprint("s", i), CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = ss.ActorKey
	}
	for i := range senders {
		wg.Go(func() {
			for j := range each {
				if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage,
					Payload: []byte(fmt.Sprintf(`{"message":"%d-%d"}`, i, j))}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Not a timing assertion: with 16 concurrent senders, some appends
	// must have queued behind a transaction in flight.
	if n := s.sharedWrites.Load(); n == 0 {
		t.Errorf("none of %d concurrent appends shared a transaction", senders*each)
	} else {
		t.Logf("%d of %d appends shared a transaction", n, senders*each)
	}
	for i, key := range keys {
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: key, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != each {
			t.Fatalf("session %d has %d events, want %d", i, len(evs), each)
		}
		for j, e := range evs {
			if e.Seq != int64(j+1) || string(e.Payload) != fmt.Sprintf(`{"message":"%d-%d"}`, i, j) {
				t.Fatalf("session %d event %d: seq %d payload %s", i, j, e.Seq, e.Payload)
			}
		}
	}
}

// TestGroupWriteOfAGoneCallerNeverRuns: a caller whose context ends while
// its write waits behind a transaction in flight returns its context's
// error, and its write never runs: it would write the variables of a
// caller that has returned (the race detector found it in the host's
// alarm sweep) and commit what its caller was told failed.
func TestGroupWriteOfAGoneCallerNeverRuns(t *testing.T) {
	s := groupStore(t)
	started, release := make(chan struct{}), make(chan struct{})
	slow := make(chan error, 1)
	go func() {
		slow <- s.write(context.Background(), "slow", func(tx *txn) error {
			close(started)
			<-release
			return auditWrite("slow", nil)(tx)
		})
	}()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	ran := false
	gone := make(chan error, 1)
	go func() {
		gone <- s.write(ctx, "gone", func(tx *txn) error {
			ran = true
			return auditWrite("gone", nil)(tx)
		})
	}()
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the gone caller: %v, want context.Canceled", err)
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	// A write after both: the flusher has passed the gone one.
	if err := s.write(context.Background(), "after", auditWrite("after", nil)); err != nil {
		t.Fatal(err)
	}
	if ran {
		t.Error("the write of a caller that had returned ran")
	}
	if got := auditObjects(t, s); fmt.Sprint(got) != "[slow after]" {
		t.Fatalf("committed %v, want [slow after]", got)
	}
}
