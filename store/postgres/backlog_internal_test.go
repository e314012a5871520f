package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// TestTurnStatementsStayIndexBoundedUnderABurst: a turn's dispatch and
// commit cost the same whether one or thousands of events wait behind the
// turn's event, even when the table's statistics predate the burst (a
// sleeping session woken by thousands of queued signals before autovacuum
// analyzed them). Statistics that saw no open event make the open-events
// index look empty; a statement that finds its event by id while also
// naming the session and status = 'open' was then planned on that index
// and read every open event of the session (the event's close: 3,000
// rows removed by its filter here). The test runs the dispatch's and the
// commit's statements under EXPLAIN ANALYZE (rolled back) and bounds the
// rows their scans discarded.
func TestTurnStatementsStayIndexBoundedUnderABurst(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "sha256:burst", ABIVersion: abi.Version, Bytes: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "burst", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	sess, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	key := sess.ActorKey
	// Statistics taken before the burst, and none after it.
	for _, sql := range []string{`ALTER TABLE actor_events SET (autovacuum_enabled = off)`, `ANALYZE actor_events`} {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	const burst = 3000
	for i := range burst {
		if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
			Payload: json.RawMessage(fmt.Sprintf(`{"message":"%d"}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "h", LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The dispatch's one statement, as the group commit sends it.
	next := store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true,
		ExpectDue: true, Expect: &store.ExpectedBinding{Binding: m.Digest,
			Agent: store.AgentBinding{Namespace: store.DefaultNamespace, Kind: "wasm", ModuleDigest: m.Digest}}}
	b := &pgx.Batch{}
	queueClaim(b, next, false)
	explainBounded(t, s, "dispatch", b.QueuedQueries[0])

	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: m.Digest, MarkSent: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Event.Seq != 1 {
		t.Fatalf("dispatched seq %d, want 1", d.Event.Seq)
	}
	p := store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}}, Payloads: []string{string(d.Event.Payload)}}
	b = &pgx.Batch{}
	queueCommit(b, p, p.Payloads, true, store.AlarmWrites{}, nil)
	for _, q := range b.QueuedQueries {
		explainBounded(t, s, "commit", q)
	}
}

// explainBounded runs q under EXPLAIN ANALYZE in a transaction it rolls
// back, and fails the test when its plan's scans discarded more than a
// handful of rows (a scan over the session's open events instead of the
// one row it wants).
func explainBounded(t *testing.T, s *Store, what string, q *pgx.QueuedQuery) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var out []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.SQL, q.Arguments...).Scan(&out); err != nil {
		t.Fatalf("%s: explain: %v\n%s", what, err, q.SQL)
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("%s: plan: %v", what, err)
	}
	removed, worst := plans[0].Plan.removed()
	if removed > 50 {
		t.Errorf("%s: its scans discarded %d rows (worst: %s), want a few: a statement reads the session's open events\n%s",
			what, removed, worst, q.SQL)
	}
}

// planNode is one node of an EXPLAIN (FORMAT JSON) plan.
type planNode struct {
	NodeType string     `json:"Node Type"`
	Index    string     `json:"Index Name"`
	Removed  int64      `json:"Rows Removed by Filter"`
	Plans    []planNode `json:"Plans"`
}

// removed sums the rows discarded by the filters of n and its children
// and names the node that discarded the most.
func (n planNode) removed() (total int64, worst string) {
	total, most := n.Removed, n.Removed
	worst = fmt.Sprintf("%s %s: %d", n.NodeType, n.Index, n.Removed)
	for _, c := range n.Plans {
		t, w := c.removed()
		total += t
		if t > most {
			most, worst = t, w
		}
	}
	return total, worst
}
