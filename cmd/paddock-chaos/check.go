package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The checker reads the store directly (the schema of
// store/postgres/migrations), never through a host: what the database holds
// is the truth the invariants are about (docs/DESIGN.md "Invariants").

// Check names, as printed.
const (
	checkTerminal    = "1 terminal"    // every accepted signal ended in exactly one terminal state
	checkTranscript  = "2 transcript"  // each committed event once, in acceptance order
	checkEpochs      = "3 epochs"      // no commit from an epoch below one already used
	checkActivations = "4 activations" // no expired live activation left
	checkState       = "5 state"       // the notes state carries every committed note once, in order
	checkDriver      = "0 driver"      // every signal accepted, in order
	checkRun         = "0 run"         // processes behaved (no crash of Paddock's own), quiescence reached
)

var allChecks = []string{checkDriver, checkRun, checkTerminal, checkTranscript, checkEpochs, checkActivations, checkState}

// waitQuiescent waits until no event of the store is open (every accepted
// signal is terminal), or fails the run at the timeout.
func waitQuiescent(ctx context.Context, conn *pgx.Conn, cfg Config, rep *Report) bool {
	deadline := time.Now().Add(cfg.QuiesceTimeout)
	last := time.Time{}
	for {
		var open int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM actor_events WHERE status = 'open'`).Scan(&open)
		if err == nil && open == 0 {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if time.Now().After(deadline) {
			rep.fail(checkRun, "", fmt.Sprintf("not quiescent: %d events still open %v after the chaos phase (the terminal check lists them)", open, cfg.QuiesceTimeout))
			return false
		}
		if time.Since(last) > 10*time.Second {
			cfg.logf("waiting for quiescence: %d events open (err %v)", open, err)
			last = time.Now()
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type dbEvent struct {
	id, seq   int64
	kind      string
	payload   string
	status    string
	attempts  int
	idemKey   *string
	lastError *string
}

func (e dbEvent) message() string {
	var p struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal([]byte(e.payload), &p)
	return p.Message
}

func (e dbEvent) String() string {
	s := fmt.Sprintf("event %d (seq %d, %s, %q, %s, %d attempts", e.id, e.seq, e.kind, e.message(), e.status, e.attempts)
	if e.lastError != nil {
		s += ", last error: " + *e.lastError
	}
	return s + ")"
}

type dbTurn struct {
	no, eventID, epoch int64
	outcome, delivery  string
	committedAt        time.Time
	messages           []dbMessage
}

type dbMessage struct {
	idx     int
	role    string
	content string
}

type dbSession struct {
	status   string
	epoch    int64
	turns    int64
	events   []dbEvent
	byID     map[int64]dbEvent
	turnList []dbTurn
	state    []byte
}

// load reads every row of the run's sessions.
func load(ctx context.Context, conn *pgx.Conn) (map[string]*dbSession, error) {
	out := map[string]*dbSession{}
	rows, err := conn.Query(ctx, `SELECT session_id, status, actor_epoch, turn_count FROM sessions`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		s := &dbSession{byID: map[int64]dbEvent{}}
		var id string
		if err := rows.Scan(&id, &s.status, &s.epoch, &s.turns); err != nil {
			return nil, err
		}
		out[id] = s
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = conn.Query(ctx, `SELECT session_id, event_id, seq, kind, payload, status, attempts, idempotency_key, last_error
		FROM actor_events ORDER BY session_id, seq`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var e dbEvent
		if err := rows.Scan(&id, &e.id, &e.seq, &e.kind, &e.payload, &e.status, &e.attempts, &e.idemKey, &e.lastError); err != nil {
			return nil, err
		}
		if s := out[id]; s != nil {
			s.events = append(s.events, e)
			s.byID[e.id] = e
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = conn.Query(ctx, `SELECT session_id, turn_no, event_id, actor_epoch, outcome, delivery_id, committed_at
		FROM turns ORDER BY session_id, turn_no`)
	if err != nil {
		return nil, err
	}
	idx := map[string]map[int64]int{}
	for rows.Next() {
		var id string
		var t dbTurn
		if err := rows.Scan(&id, &t.no, &t.eventID, &t.epoch, &t.outcome, &t.delivery, &t.committedAt); err != nil {
			return nil, err
		}
		if s := out[id]; s != nil {
			if idx[id] == nil {
				idx[id] = map[int64]int{}
			}
			idx[id][t.no] = len(s.turnList)
			s.turnList = append(s.turnList, t)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = conn.Query(ctx, `SELECT session_id, turn_no, idx, role, content FROM messages ORDER BY session_id, turn_no, idx`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var no int64
		var m dbMessage
		if err := rows.Scan(&id, &no, &m.idx, &m.role, &m.content); err != nil {
			return nil, err
		}
		if s := out[id]; s != nil {
			if i, ok := idx[id][no]; ok {
				s.turnList[i].messages = append(s.turnList[i].messages, m)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = conn.Query(ctx, `SELECT session_id, state FROM session_state`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var st []byte
		if err := rows.Scan(&id, &st); err != nil {
			return nil, err
		}
		if s := out[id]; s != nil {
			s.state = st
		}
	}
	return out, rows.Err()
}

// check runs the checks and fills rep.
func check(ctx context.Context, conn *pgx.Conn, e *env, sessions []*session, rep *Report) error {
	db, err := load(ctx, conn)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, s := range sessions {
		known[s.id] = true
		checkSession(s, db[s.id], rep)
	}
	for id, d := range db {
		if !known[id] {
			rep.fail(checkRun, id, fmt.Sprintf("a session the driver did not create (status %s, %d events)", d.status, len(d.events)))
		}
	}
	if err := checkFencedCommits(ctx, conn, rep); err != nil {
		return err
	}
	if err := checkLiveActivations(ctx, conn, e.cfg, rep); err != nil {
		return err
	}
	if err := latencyStats(ctx, conn, rep); err != nil {
		return err
	}
	return attemptStats(ctx, conn, rep)
}

// latencyStats reads how long committed events took from acceptance to
// commit (both by the database clock), overall and per agent, and how long
// each took from the moment it headed its session's queue (acceptance, or
// the commit of the session's previous event if later): a session runs one
// event at a time, so one slow turn delays the ones queued behind it, and
// only the second figure says which turn itself was slow. The slowest by
// that measure are reported with their error chains.
func latencyStats(ctx context.Context, conn *pgx.Conn, rep *Report) error {
	rows, err := conn.Query(ctx, `SELECT g.name, e.session_id, e.event_id, e.accepted_at, t.committed_at
		FROM turns t JOIN actor_events e ON e.event_id = t.event_id JOIN agents g ON g.agent_uid = e.agent_uid
		ORDER BY e.session_id, e.seq`)
	if err != nil {
		return err
	}
	type lat struct {
		agent, session string
		event          int64
		total, own     float64
	}
	var all []lat
	var prevSession string
	var prevCommit time.Time
	for rows.Next() {
		var l lat
		var accepted, committed time.Time
		if err := rows.Scan(&l.agent, &l.session, &l.event, &accepted, &committed); err != nil {
			rows.Close()
			return err
		}
		head := accepted
		if l.session == prevSession && prevCommit.After(head) {
			head = prevCommit
		}
		l.total, l.own = committed.Sub(accepted).Seconds(), committed.Sub(head).Seconds()
		prevSession, prevCommit = l.session, committed
		all = append(all, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(all) == 0 {
		return nil
	}
	quantiles := func(xs []float64) map[string]float64 {
		sort.Float64s(xs)
		q := func(p float64) float64 { return xs[min(len(xs)-1, int(p*float64(len(xs))))] }
		return map[string]float64{"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": xs[len(xs)-1]}
	}
	var totals, owns []float64
	byAgent := map[string][]float64{}
	for _, l := range all {
		totals, owns = append(totals, l.total), append(owns, l.own)
		byAgent[l.agent] = append(byAgent[l.agent], l.own)
	}
	rep.Latency, rep.OwnLatency = quantiles(totals), quantiles(owns)
	rep.OwnLatencyByAgent = map[string]map[string]float64{}
	for a, xs := range byAgent {
		rep.OwnLatencyByAgent[a] = quantiles(xs)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].own > all[j].own })
	for _, l := range all[:min(3, len(all))] {
		slow := fmt.Sprintf("event %d (%s, session %s): %.3f s at the head of its session, %.3f s since acceptance", l.event, l.agent, l.session, l.own, l.total)
		erows, err := conn.Query(ctx, `SELECT attempt_seq, counted, actor_epoch, error,
				extract(epoch FROM failed_at - (SELECT accepted_at FROM actor_events WHERE event_id = $1))::float8
			FROM event_errors WHERE event_id = $1 ORDER BY attempt_seq`, l.event)
		if err != nil {
			return err
		}
		for erows.Next() {
			var seq int
			var counted bool
			var epoch int64
			var msg string
			var at float64
			if err := erows.Scan(&seq, &counted, &epoch, &msg, &at); err != nil {
				erows.Close()
				return err
			}
			if len(msg) > 160 {
				msg = msg[:160] + "…"
			}
			slow += fmt.Sprintf("\n    +%.3f s after acceptance: attempt %d failed (epoch %d, counted %t): %s", at, seq, epoch, counted, msg)
		}
		erows.Close()
		if err := erows.Err(); err != nil {
			return err
		}
		rep.Slowest = append(rep.Slowest, slow)
	}
	return nil
}

// checkSession runs checks 1, 2, 3 and 5 on one session.
func checkSession(s *session, d *dbSession, rep *Report) {
	where := fmt.Sprintf("%s (%s, session %s)", s.name, s.agent, s.id)
	rep.Accepted += len(s.accepted)
	if d == nil {
		rep.fail(checkTerminal, where, "the session is not in the store")
		rep.Lost += len(s.accepted)
		return
	}
	if d.status != "active" {
		rep.fail(checkTerminal, where, fmt.Sprintf("session status %s, want active (crash policy restart, never destroyed)", d.status))
	}
	// Where each event sits in the transcript.
	inTranscript := map[int64][]int64{} // event id → turn numbers
	for _, t := range d.turnList {
		inTranscript[t.eventID] = append(inTranscript[t.eventID], t.no)
	}

	// 1. Every accepted signal: its event, with its payload, in exactly one
	// terminal state (the status column holds one value; a committed event
	// that is also dead-lettered would show as a done event without a turn
	// or a dead letter with one).
	accepted := map[int64]bool{}
	for _, a := range s.accepted {
		accepted[a.eventID] = true
		ev, ok := d.byID[a.eventID]
		switch {
		case !ok:
			rep.Lost++
			rep.fail(checkTerminal, where, fmt.Sprintf("signal %q was accepted as event %d, which is not in the store", a.message, a.eventID))
			continue
		case ev.message() != a.message:
			rep.fail(checkTerminal, where, fmt.Sprintf("signal %q was accepted as event %d, which holds %q", a.message, a.eventID, ev.message()))
		}
		turns := inTranscript[ev.id]
		switch ev.status {
		case "done":
			rep.Committed++
			if len(turns) == 0 {
				rep.Lost++
				rep.fail(checkTerminal, where, fmt.Sprintf("%s is done but no turn of the transcript holds it", ev))
			}
		case "dead_letter":
			rep.DeadLettered++
			rep.DeadLetters = append(rep.DeadLetters, where+": "+ev.String())
			if len(turns) > 0 {
				rep.fail(checkTerminal, where, fmt.Sprintf("%s is dead-lettered and also committed by turn(s) %v", ev, turns))
			}
		case "cancelled", "discarded":
			// Terminal, but nothing in this run cancels or discards.
			rep.Unexpected++
			rep.fail(checkTerminal, where, fmt.Sprintf("%s: nothing in this run cancels or discards an event", ev))
		default:
			rep.Lost++
			rep.fail(checkTerminal, where, fmt.Sprintf("%s never reached a terminal state", ev))
		}
	}
	for _, ev := range d.events {
		if accepted[ev.id] {
			continue
		}
		// Written by a call whose answer was lost and never retried (the
		// driver retries until it hears one, so only an interrupted send).
		rep.Unconfirmed++
		if ev.status == "open" {
			rep.fail(checkTerminal, where, fmt.Sprintf("%s (never confirmed to the driver) is still open", ev))
		}
	}

	// 2. The transcript: turns numbered 1..n, each a done event exactly
	// once, in acceptance order, the user message the signal's; every
	// payload committed once.
	var prev dbEvent
	seenPayload := map[string]int64{}
	for i, t := range d.turnList {
		if t.no != int64(i+1) {
			rep.fail(checkTranscript, where, fmt.Sprintf("turn numbers jump from %d to %d", i, t.no))
		}
		ev, ok := d.byID[t.eventID]
		if !ok {
			rep.fail(checkTranscript, where, fmt.Sprintf("turn %d commits event %d, which is not the session's", t.no, t.eventID))
			continue
		}
		if ev.status != "done" {
			rep.fail(checkTranscript, where, fmt.Sprintf("turn %d commits %s, which is not done", t.no, ev))
		}
		if n := len(inTranscript[ev.id]); n > 1 && inTranscript[ev.id][0] == t.no {
			rep.Duplicated++
			rep.fail(checkTranscript, where, fmt.Sprintf("%s is committed %d times, by turns %v", ev, n, inTranscript[ev.id]))
		}
		if i > 0 && (ev.seq <= prev.seq || ev.id <= prev.id) {
			rep.fail(checkTranscript, where, fmt.Sprintf("turn %d commits %s after turn %d committed %s: not acceptance order", t.no, ev, t.no-1, prev))
		}
		prev = ev
		if t.outcome != "ok" {
			rep.fail(checkTranscript, where, fmt.Sprintf("turn %d of %s has outcome %s, want ok", t.no, ev, t.outcome))
		}
		var user []string
		for _, m := range t.messages {
			if m.role == "user" {
				user = append(user, m.content)
			}
		}
		if len(user) != 1 || user[0] != ev.message() {
			rep.fail(checkTranscript, where, fmt.Sprintf("turn %d of %s records user message(s) %q", t.no, ev, user))
		}
		for _, u := range user {
			if first, dup := seenPayload[u]; dup {
				rep.Duplicated++
				rep.fail(checkTranscript, where, fmt.Sprintf("payload %q committed twice: turns %d and %d", u, first, t.no))
			} else {
				seenPayload[u] = t.no
			}
		}
	}
	if int64(len(d.turnList)) != d.turns {
		rep.fail(checkTranscript, where, fmt.Sprintf("sessions.turn_count %d, but %d turns", d.turns, len(d.turnList)))
	}

	// 3. Epochs: a commit's epoch is never below an earlier commit's, nor
	// above the session's highest issued epoch.
	var maxEpoch int64
	for _, t := range d.turnList {
		if t.epoch < maxEpoch {
			ev := d.byID[t.eventID]
			rep.fail(checkEpochs, where, fmt.Sprintf("turn %d (%s) committed under epoch %d after a commit under epoch %d", t.no, ev, t.epoch, maxEpoch))
		}
		maxEpoch = max(maxEpoch, t.epoch)
		if t.epoch > d.epoch {
			rep.fail(checkEpochs, where, fmt.Sprintf("turn %d committed under epoch %d, above the session's epoch %d", t.no, t.epoch, d.epoch))
		}
	}

	// 5. The notes state: the k-th turn answered "noted (k)" (it saw the
	// state of the k-1 turns before it, not an older or a lost one), and the
	// final state holds exactly the committed notes, in order.
	var want []string
	for i, t := range d.turnList {
		var reply string
		for _, m := range t.messages {
			if m.role == "assistant" {
				reply = m.content
			}
		}
		if exp := fmt.Sprintf("noted (%d)", i+1); reply != exp {
			rep.fail(checkState, where, fmt.Sprintf("turn %d (%s) answered %q, want %q: it did not see the state of the turns before it", t.no, d.byID[t.eventID], reply, exp))
		}
		want = append(want, strings.TrimPrefix(d.byID[t.eventID].message(), "note "))
	}
	var st struct {
		Notes []string `json:"notes"`
		Turns int      `json:"turns"`
	}
	if len(d.state) > 0 {
		if err := json.Unmarshal(d.state, &st); err != nil {
			rep.fail(checkState, where, fmt.Sprintf("session state is not the notes state: %v", err))
		}
	}
	if !equalStrings(st.Notes, want) || st.Turns != len(d.turnList) {
		rep.fail(checkState, where, fmt.Sprintf("final state has %d notes and %d turns, the transcript %d committed notes; first difference: %s",
			len(st.Notes), st.Turns, len(want), firstDiff(st.Notes, want)))
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func firstDiff(got, want []string) string {
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("note %d is %q in the state, %q in the transcript", i+1, g, w)
		}
	}
	return "none"
}

// checkFencedCommits is the rest of check 3, from the fence rows: every
// turn was committed through its delivery (accepted, same event, same epoch
// as the activation it was sent under), no event has two accepted
// deliveries, and no turn committed under epoch E after an activation of a
// higher epoch had been created for its session (by then E's activation had
// ended, and its reply had to be refused).
func checkFencedCommits(ctx context.Context, conn *pgx.Conn, rep *Report) error {
	rows, err := conn.Query(ctx, `
		SELECT t.session_id, t.turn_no, t.event_id, t.actor_epoch, t.delivery_id, d.state, d.event_id, d.actor_epoch, a.actor_epoch
		FROM turns t
		LEFT JOIN deliveries d ON d.delivery_id = t.delivery_id
		LEFT JOIN activations a ON a.activation_uid = d.activation_uid
		WHERE d.delivery_id IS NULL OR d.state <> 'accepted' OR d.event_id <> t.event_id
		   OR d.actor_epoch <> t.actor_epoch OR a.actor_epoch IS DISTINCT FROM t.actor_epoch`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var session, delivery string
		var turn, event, epoch int64
		var dState *string
		var dEvent, dEpoch, aEpoch *int64
		if err := rows.Scan(&session, &turn, &event, &epoch, &delivery, &dState, &dEvent, &dEpoch, &aEpoch); err != nil {
			rows.Close()
			return err
		}
		rep.fail(checkEpochs, "session "+session, fmt.Sprintf("turn %d (event %d, epoch %d) names delivery %s: state %s, event %s, epoch %s, its activation's epoch %s",
			turn, event, epoch, delivery, str(dState), str(dEvent), str(dEpoch), str(aEpoch)))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = conn.Query(ctx, `SELECT session_id, event_id, count(*) FROM deliveries WHERE state = 'accepted'
		GROUP BY session_id, event_id HAVING count(*) > 1`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var session string
		var event, n int64
		if err := rows.Scan(&session, &event, &n); err != nil {
			rows.Close()
			return err
		}
		rep.fail(checkEpochs, "session "+session, fmt.Sprintf("event %d has %d accepted deliveries", event, n))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	// The activations of each session by creation time, then each turn
	// against the first activation of a higher epoch.
	type act struct {
		uid     string
		epoch   int64
		created time.Time
	}
	acts := map[string][]act{}
	rows, err = conn.Query(ctx, `SELECT session_id, activation_uid, actor_epoch, created_at FROM activations ORDER BY created_at`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var session string
		var a act
		if err := rows.Scan(&session, &a.uid, &a.epoch, &a.created); err != nil {
			rows.Close()
			return err
		}
		acts[session] = append(acts[session], a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = conn.Query(ctx, `SELECT session_id, turn_no, event_id, actor_epoch, committed_at FROM turns`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var session string
		var turn, event, epoch int64
		var committed time.Time
		if err := rows.Scan(&session, &turn, &event, &epoch, &committed); err != nil {
			return err
		}
		for _, a := range acts[session] {
			if !a.created.Before(committed) {
				break
			}
			if a.epoch > epoch {
				rep.fail(checkEpochs, "session "+session, fmt.Sprintf("turn %d (event %d) committed under epoch %d at %s, after activation %s of epoch %d was created at %s",
					turn, event, epoch, committed.Format(time.RFC3339Nano), a.uid, a.epoch, a.created.Format(time.RFC3339Nano)))
				break
			}
		}
	}
	return rows.Err()
}

// str prints a nullable value.
func str[T any](p *T) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// checkLiveActivations is check 4: no session holds a live activation whose
// lease expired (by the database's clock). An expired lease is normal for
// a moment (until a watchdog's next scan fails it), so an activation counts
// only if it is still live and expired on a second look, several scan
// intervals later.
func checkLiveActivations(ctx context.Context, conn *pgx.Conn, cfg Config, rep *Report) error {
	type act struct {
		session, uid, host, state string
		epoch                     int64
		expiredFor                time.Duration
		current                   *int64
	}
	read := func() (map[string]act, error) {
		rows, err := conn.Query(ctx, `SELECT session_id, activation_uid, host_id, state, actor_epoch,
				extract(epoch FROM clock_timestamp() - lease_expires_at)::float8, current_event_id
			FROM activations
			WHERE state IN ('starting', 'active', 'draining') AND lease_expires_at < clock_timestamp()`)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]act{}
		for rows.Next() {
			var a act
			var secs float64
			if err := rows.Scan(&a.session, &a.uid, &a.host, &a.state, &a.epoch, &secs, &a.current); err != nil {
				return nil, err
			}
			a.expiredFor = time.Duration(secs * float64(time.Second))
			out[a.uid] = a
		}
		return out, rows.Err()
	}
	first, err := read()
	if err != nil {
		return err
	}
	if len(first) > 0 {
		time.Sleep(3*cfg.ScanInterval + time.Second)
		second, err := read()
		if err != nil {
			return err
		}
		for uid, a := range second {
			if _, ok := first[uid]; ok {
				cur := "none"
				if a.current != nil {
					cur = fmt.Sprint(*a.current)
				}
				rep.fail(checkActivations, "session "+a.session, fmt.Sprintf("live activation %s (%s, epoch %d, host %s, current event %s) expired %v ago",
					uid, a.state, a.epoch, a.host, cur, a.expiredFor.Round(time.Millisecond)))
			}
		}
	}
	var multi int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM activations
		WHERE state IN ('starting', 'active', 'draining') GROUP BY agent_uid, session_id HAVING count(*) > 1) x`).Scan(&multi); err != nil {
		return err
	}
	if multi > 0 {
		rep.fail(checkActivations, "", fmt.Sprintf("%d sessions hold more than one live activation", multi))
	}
	return nil
}

// attemptStats reads the failed attempts (event_errors) by cause.
func attemptStats(ctx context.Context, conn *pgx.Conn, rep *Report) error {
	rows, err := conn.Query(ctx, `SELECT counted, error FROM event_errors`)
	if err != nil {
		return err
	}
	defer rows.Close()
	rep.FailedAttempts = map[string]int{}
	for rows.Next() {
		var counted bool
		var msg string
		if err := rows.Scan(&counted, &msg); err != nil {
			return err
		}
		if counted {
			rep.CountedAttempts++
		} else {
			rep.UncountedAttempts++
		}
		rep.FailedAttempts[errorClass(msg)]++
	}
	return rows.Err()
}

// errorClass is the kind of an error chain: its text up to the first
// colon ("kind: cause [where]").
func errorClass(msg string) string {
	if i := strings.IndexByte(msg, ':'); i > 0 {
		msg = msg[:i]
	}
	if len(msg) > 60 {
		msg = msg[:60]
	}
	return msg
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
