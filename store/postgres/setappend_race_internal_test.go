package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// TestSetAppendKeyRacedByAnotherTransaction: another transaction holds a
// session's row and inserts an event with an idempotency key that a set
// append also carries; once it commits, the set append (which waited for
// the row) raises on the unique index instead of appending the key twice,
// and writes nothing (its batch then runs request by request). The set
// append's other events keep their traceparents.
func TestSetAppendKeyRacedByAnotherTransaction(t *testing.T) {
	ctx := context.Background()
	s, agent := setAppendStore(t)
	var keys []store.ActorKey
	for i := range 9 {
		ss, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: agent, SessionID: fmt.Sprint("r", i), CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, ss.ActorKey)
	}
	var reqs []*groupReq[appendIn, appendRes]
	for i, key := range keys {
		r := appendReq(s, key, fmt.Sprint("m", i), fmt.Sprint("k", i), nil)
		r.in.ne.traceparent = fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)
		reqs = append(reqs, r)
	}
	items := make([]groupItem, len(reqs))
	for i, r := range reqs {
		items[i] = r
	}

	// Without the race: every event stored with its traceparent.
	b := &pgx.Batch{}
	if !queueSetAppends(b, live(items)) {
		t.Fatal("no set append")
	}
	tx0, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx0.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	for i, r := range reqs {
		if a := r.answer(); a.solo || a.e.Traceparent != r.in.ne.traceparent || a.e.Seq != 1 {
			t.Errorf("append %d: %+v", i, a)
		}
	}
	_ = tx0.Rollback(ctx)

	// The race.
	other, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if err := sessionWritable(ctx, other, keys[4]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := insertEvent(ctx, other, keys[4], newEvent{kind: "message", payload: `{"message":"other"}`, idempotencyKey: "k4"}); err != nil {
		t.Fatal(err)
	}
	b = &pgx.Batch{}
	if !queueSetAppends(b, live(items)) {
		t.Fatal("no set append")
	}
	done := make(chan error, 1)
	go func() { done <- s.pool.SendBatch(ctx, b).Close() }()
	time.Sleep(300 * time.Millisecond) // the set append waits for keys[4]'s row
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if pgCode(err) != codeUniqueViolation {
		t.Fatalf("the raced set append: %v, want a unique violation", err)
	}
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM actor_events WHERE agent_uid = $1`, agent).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d events after the raced set append, want the other transaction's one", n)
	}
}

// TestSetAppendAuditStatusOutOfRange: an audited append whose status does
// not fit the column (integer) is refused on the single-statement path
// (pgx will not encode it); the set append must not store it wrapped.
func TestSetAppendAuditStatusOutOfRange(t *testing.T) {
	ctx := context.Background()
	s, agent := setAppendStore(t)
	const status = 1<<32 + 202
	audit := &store.AppendAuditParams{TokenID: "tok", Action: "signal.send", Result: "ok", Status: status}

	single, err := Open(ctx, s.pool.Config().ConnString(), WithoutGroupCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close()
	ss, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: agent, SessionID: "single", CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	_, _, singleErr := single.AppendEvent(ctx, store.AppendEventParams{Key: ss.ActorKey, Kind: "message", Payload: []byte(`{"message":"x"}`), Audit: audit})
	t.Logf("single-statement path: %v", singleErr)

	var reqs []*groupReq[appendIn, appendRes]
	for i := range setAppendMin {
		ss, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: agent, SessionID: fmt.Sprint("s", i), CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, appendReq(s, ss.ActorKey, fmt.Sprint("m", i), "", audit))
	}
	items := make([]groupItem, len(reqs))
	for i, r := range reqs {
		items[i] = r
	}
	b := &pgx.Batch{}
	if !queueSetAppends(b, live(items)) {
		t.Fatal("no set append")
	}
	setErr := s.pool.SendBatch(ctx, b).Close()
	var wrapped int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE status = 202`).Scan(&wrapped); err != nil {
		t.Fatal(err)
	}
	if singleErr != nil && (setErr == nil || wrapped != 0) {
		t.Errorf("status %d: the single path refused it (%v), the set append answered %v and stored %d audit rows with status 202", status, singleErr, setErr, wrapped)
	}
}
