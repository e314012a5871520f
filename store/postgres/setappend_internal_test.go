package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// The set append (setappend.go), driven batch by batch: each append of a
// batch gets exactly its own answer.

// agentStore opens a store with one agent of a module of digest
// "sha256:"+name and returns it with the agent.
func agentStore(t *testing.T, name string) (*Store, store.Agent) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	m, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "sha256:" + name, ABIVersion: abi.Version, Bytes: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: name, ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	return s, a
}

// setAppendStore is agentStore for the set append's tests: the store and
// the agent's uid.
func setAppendStore(t *testing.T) (*Store, string) {
	t.Helper()
	s, a := agentStore(t, "setappend")
	return s, a.UID
}

// appendReq is an append request of the acceptance lane, as AppendEvent
// makes it.
func appendReq(s *Store, key store.ActorKey, message, idem string, audit *store.AppendAuditParams) *groupReq[appendIn, appendRes] {
	payload := fmt.Sprintf(`{"message":%q}`, message)
	return &groupReq[appendIn, appendRes]{g: s.appends, ctx: context.Background(), in: appendIn{key: key,
		ne: newEvent{kind: abi.EventMessage, payload: payload, idempotencyKey: idem, origin: s.origin}, eventAudit: audit}}
}

// sendAcceptanceBatch queues reqs as the acceptance lane's flush does and
// sends them as one batch; it fails the test unless the set append went
// out.
func sendAcceptanceBatch(t *testing.T, s *Store, reqs ...*groupReq[appendIn, appendRes]) {
	t.Helper()
	items := make([]groupItem, len(reqs))
	for i, r := range reqs {
		items[i] = r
	}
	b := &pgx.Batch{}
	if !queueSetAppends(b, live(items)) {
		t.Fatal("the batch did not go out as a set append")
	}
	if err := s.pool.SendBatch(context.Background(), b).Close(); err != nil {
		t.Fatalf("set append batch: %v", err)
	}
}

// TestSetAppendAnswersEachAppend: one batch holding several appends to one
// session, an append that wakes a sleeping session, a used idempotency
// key, a key repeated within the batch, appends to a destroyed and to a
// missing session, an audited append and an audit row. The appends that
// can be decided commit, in order, with one notification each; the others
// write nothing and answer solo, and AppendEvent's own path then gives
// each its documented outcome.
func TestSetAppendAnswersEachAppend(t *testing.T) {
	ctx := context.Background()
	s, agent := setAppendStore(t)
	session := func(id string) store.ActorKey {
		t.Helper()
		ss, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: agent, SessionID: id, CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		return ss.ActorKey
	}
	busy, sleepy, used, twice, dead, audited := session("busy"), session("sleepy"), session("used"), session("twice"),
		session("dead"), session("audited")
	missing := store.ActorKey{AgentUID: agent, SessionID: "missing"}
	first, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: used, Kind: abi.EventMessage, Payload: []byte(`{"message":"first"}`), IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: busy, Kind: abi.EventMessage, Payload: []byte(`{"message":"earlier"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SleepSession(ctx, store.SleepSessionParams{Key: sleepy, Reason: "idle"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DestroySession(ctx, dead); err != nil {
		t.Fatal(err)
	}

	listen, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Release()
	if _, err := listen.Exec(ctx, `LISTEN `+notifyChannel); err != nil {
		t.Fatal(err)
	}

	audit := &store.AppendAuditParams{TokenID: "tok", Namespace: "default", Action: "signal.send", Object: "/x", Result: "ok", Status: 202}
	row := &store.AppendAuditParams{TokenID: "tok2", Action: "session.get", Result: "ok", Status: 200}
	reqs := []*groupReq[appendIn, appendRes]{
		appendReq(s, busy, "b1", "", nil),
		appendReq(s, dead, "late", "", nil),
		appendReq(s, twice, "t1", "same", nil),
		appendReq(s, busy, "b2", "", nil),
		appendReq(s, used, "again", "k", nil),
		appendReq(s, sleepy, "wake", "", nil),
		appendReq(s, twice, "t2", "same", nil),
		appendReq(s, missing, "nobody", "", nil),
		appendReq(s, audited, "a1", "", audit),
		appendReq(s, busy, "b3", "", nil),
		{g: s.appends, ctx: ctx, in: appendIn{audit: row}},
	}
	sendAcceptanceBatch(t, s, reqs...)

	type want struct {
		session string
		seq     int64 // 0: solo
	}
	wants := []want{{"busy", 2}, {"dead", 0}, {"twice", 1}, {"busy", 3}, {"used", 0}, {"sleepy", 1}, {"twice", 0},
		{"missing", 0}, {"audited", 1}, {"busy", 4}}
	for i, w := range wants {
		r := reqs[i].answer()
		msg := reqs[i].in.ne.payload
		switch {
		case r.err != nil:
			t.Errorf("append %d (%s %s): %v", i, w.session, msg, r.err)
		case w.seq == 0 && !r.solo:
			t.Errorf("append %d (%s %s) answered %+v, want solo", i, w.session, msg, r)
		case w.seq != 0 && (r.solo || !r.created || r.e.Seq != w.seq || r.e.SessionID != w.session || string(r.e.Payload) != msg ||
			r.e.Status != store.EventOpen || r.e.ID == 0):
			t.Errorf("append %d (%s %s) answered %+v, want event seq %d", i, w.session, msg, r, w.seq)
		}
	}
	if r := reqs[len(reqs)-1].answer(); r.err != nil || r.row.ID == 0 || r.row.TokenID != "tok2" {
		t.Errorf("the batch's audit row: %+v", r)
	}

	// The sessions' rows and events as the statement left them.
	var seq int64
	var status string
	for _, c := range []struct {
		key    store.ActorKey
		seq    int64
		status string
	}{{busy, 4, "active"}, {sleepy, 1, "active"}, {used, 1, "active"}, {twice, 1, "active"}, {dead, 0, "destroyed"}, {audited, 1, "active"}} {
		if err := s.pool.QueryRow(ctx, `SELECT last_event_seq, status FROM sessions WHERE agent_uid = $1 AND session_id = $2`,
			c.key.AgentUID, c.key.SessionID).Scan(&seq, &status); err != nil {
			t.Fatal(err)
		}
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: c.key, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if seq != c.seq || status != c.status || int64(len(evs)) != c.seq {
			t.Errorf("session %s: last_event_seq %d, status %s, %d events; want %d, %s, %d", c.key.SessionID, seq, status, len(evs), c.seq, c.status, c.seq)
		}
		for j, e := range evs {
			if e.Seq != int64(j+1) {
				t.Errorf("session %s event %d has seq %d", c.key.SessionID, j, e.Seq)
			}
		}
	}
	var sleepTS *time.Time
	var sleepReason *string
	if err := s.pool.QueryRow(ctx, `SELECT sleep_ts, sleep_reason FROM sessions WHERE agent_uid = $1 AND session_id = 'sleepy'`, agent).Scan(&sleepTS, &sleepReason); err != nil {
		t.Fatal(err)
	}
	if sleepTS != nil || sleepReason != nil {
		t.Errorf("the woken session kept sleep_ts %v, sleep_reason %v", sleepTS, sleepReason)
	}
	es, err := s.ListAudit(ctx, store.ListAuditParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	objects := map[string]bool{}
	for _, e := range es {
		objects[e.TokenID+" "+e.Action+" "+e.Object] = true
	}
	if len(es) != 2 || !objects["tok signal.send /x"] || !objects["tok2 session.get "] {
		t.Errorf("audit log %+v, want the audited append's row and the batch's audit row", es)
	}

	// One notification per appended event, tagged with this store's origin
	// and the event's seq.
	got := map[string]bool{}
	for range 6 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := listen.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("notifications: %v (got %v)", err, got)
		}
		got[n.Payload] = true
	}
	for _, w := range []string{"busy:2", "busy:3", "busy:4", "twice:1", "sleepy:1", "audited:1"} {
		session, seq, _ := strings.Cut(w, ":")
		if p := s.origin + ":" + seq + ":" + agent + "/" + session; !got[p] {
			t.Errorf("no notification %q among %v", p, got)
		}
	}

	// The solo appends on AppendEvent's own path.
	if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: dead, Kind: abi.EventMessage, Payload: []byte(`{"message":"late"}`)}); !errors.Is(err, store.ErrSessionDestroyed) {
		t.Errorf("append to the destroyed session: %v, want ErrSessionDestroyed", err)
	}
	if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: missing, Kind: abi.EventMessage, Payload: []byte(`{"message":"nobody"}`)}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("append to the missing session: %v, want ErrNotFound", err)
	}
	for _, c := range []struct {
		key   store.ActorKey
		idem  string
		first int64
	}{{used, "k", first.ID}, {twice, "same", reqs[2].answer().e.ID}} {
		e, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: c.key, Kind: abi.EventMessage, Payload: []byte(`{"message":"again"}`), IdempotencyKey: c.idem})
		if err != nil || created || e.ID != c.first {
			t.Errorf("re-sent key %q of %s: event %d created %v %v, want the first event %d", c.idem, c.key.SessionID, e.ID, created, err, c.first)
		}
	}
}

// TestSetAppendIndexScansStayLinear: a set append of 128 appends (two per
// session, each with an idempotency key) to tables of 1,000 and 5,000
// analyzed sessions, run as the pipe runs it (a prepared statement past
// its first five executions), reads sessions and actor_events by index a
// few times per append and scans neither table whole. With 1,000 sessions
// (the bench's), a generic plan of a semi-join had scanned sessions whole
// in every batch.
func TestSetAppendIndexScansStayLinear(t *testing.T) {
	for _, sessions := range []int{1000, 5000} {
		t.Run(fmt.Sprint(sessions, "sessions"), func(t *testing.T) { setAppendScans(t, sessions) })
	}
}

func setAppendScans(t *testing.T, sessions int) {
	const n = 128
	ctx := context.Background()
	s, agent := setAppendStore(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	exec(`INSERT INTO sessions (agent_uid, session_id, crash_policy, actor_epoch, last_event_seq, turn_count)
		SELECT $1, 'f' || g, 'restart', 1, 10, 10 FROM generate_series(1, $2::int) g`, agent, sessions)
	exec(`INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, idempotency_key, status, next_attempt_at, accepted_at, closed_at)
		SELECT $1, 'f' || g, q, 'message', '{"message":"x"}', 'i' || q, 'done', now(), now(), now()
		FROM generate_series(1, $2::int) g, generate_series(1, 10) q`, agent, sessions)
	exec(`ANALYZE`)
	var reqs []*groupReq[appendIn, appendRes]
	for i := range n {
		key := store.ActorKey{AgentUID: agent, SessionID: fmt.Sprint("f", 1+i/2)}
		reqs = append(reqs, appendReq(s, key, fmt.Sprint("m", i), fmt.Sprint("new", i), nil))
	}
	items := make([]groupItem, n)
	for i, r := range reqs {
		items[i] = r
	}
	b := &pgx.Batch{}
	if !queueSetAppends(b, live(items)) {
		t.Fatal("no set append")
	}
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	q := b.QueuedQueries[0]
	var seqScans, idxScans int64
	for range 7 { // the sixth execution and later run the generic plan
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stat := `SELECT coalesce(sum(seq_scan), 0), coalesce(sum(idx_scan), 0) FROM pg_stat_xact_user_tables
			WHERE relid IN ('sessions'::regclass, 'actor_events'::regclass)`
		var seq0, idx0 int64
		if err := tx.QueryRow(ctx, stat).Scan(&seq0, &idx0); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, q.SQL, q.Arguments...)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for rows.Next() {
			got++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if got != n {
			t.Fatalf("the set append returned %d events, want %d", got, n)
		}
		if err := tx.QueryRow(ctx, stat).Scan(&seqScans, &idxScans); err != nil {
			t.Fatal(err)
		}
		seqScans, idxScans = seqScans-seq0, idxScans-idx0
		_ = tx.Rollback(ctx)
	}
	if seqScans != 0 || idxScans > 8*n {
		t.Errorf("a set append of %d events made %d sequential and %d index scans of sessions and actor_events", n, seqScans, idxScans)
	}
}
