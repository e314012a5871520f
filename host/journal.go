package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
)

// journalWriteTimeout bounds one journal read or write. It is not the
// turn's context: a result the host already paid for is recorded even when
// the turn was cancelled meanwhile.
const journalWriteTimeout = 10 * time.Second

// journalCaller is the abi.Caller of one turn attempt (docs/DESIGN.md
// invariant 12, "Host calls and the journal"). It numbers the attempt's
// calls from 1 in the order they arrive, one at a time (a worker's
// concurrent calls are serialised), and for call k:
//
//   - when the event's journal holds a live row at k with the same request
//     digest and a result without error — or, because concurrent calls
//     arrive in another order on a retry, another live row of the same
//     digest this attempt has not replayed yet — it returns that row's
//     result marked replayed (with the row's seq), without sending the
//     request (ReplayHostCall records the replay under the fences);
//   - otherwise the attempt has diverged at k: the rows from k on are set
//     aside (kept, marked) with the first new row, and this and every later
//     call of the attempt go live through the executor, each recorded by
//     RecordHostCall under the attempt's fences as soon as its result is
//     complete, before the worker sees it.
//
// A result whose record the fences refuse (a zombie attempt: its lease
// expired, its epoch is stale, its delivery superseded) is not returned:
// the worker gets a cancelled error, and the attempt's reply would be
// refused anyway. An error result is recorded (refusals are visible in the
// journal) but never replayed: the next attempt tries again.
//
// Emits (abi.CallKindEmit) are neither numbered nor journaled nor checked
// against capabilities: they go to the attempt's stream buffer and are
// answered at once, without waiting for a call in flight. A streamed
// model call's text deltas go there too, as text chunks with the call's
// seq; a model call replayed from the journal emits its recorded text as
// one such chunk, so a retried attempt's stream is complete.
type journalCaller struct {
	h      *Host
	exec   *calls.Executor // nil: every call but emit answers not_configured
	stream *streamBuf
	agent  store.Agent
	key    store.ActorKey
	caps   calls.Capabilities
	budget *calls.Budget
	log    *slog.Logger

	refMu sync.Mutex
	ref   abi.TurnRef // the attempt's newest turn_ref (a steer raises it)

	mu       sync.Mutex // one call at a time
	seq      int
	loaded   bool
	journal  map[int]store.HostCall // the event's live rows by seq
	used     map[int]bool           // rows this attempt replayed, by seq
	lastSeq  int                    // the journal's highest live seq
	diverged bool

	// onHold ends the turn (cancels its context) when a call needs an
	// approval no one gave yet; hold is then that approval's wait, which
	// the controller opens by ending the attempt as a hold.
	onHold func()
	// promote, when set, makes a deferred turn written
	// (promotion.ensure) before its first host call.
	promote func(context.Context) error
	hold    *store.WaitParams
	// span is the attempt's span context: each call's span is its child.
	span trace.SpanContext
}

// unusedRow finds a replayable row of the request digest that this
// attempt has not replayed yet, lowest seq first.
func (c *journalCaller) unusedRow(digest string) (store.HostCall, bool) {
	best := store.HostCall{}
	for seq, r := range c.journal {
		if !c.used[seq] && r.RequestDigest == digest && r.ErrorCode == "" && (best.Seq == 0 || seq < best.Seq) {
			best = r
		}
	}
	return best, best.Seq != 0
}

// newJournalCaller returns the caller of the attempt whose first delivery
// is ref.
func newJournalCaller(h *Host, exec *calls.Executor, agent store.Agent, key store.ActorKey, caps calls.Capabilities,
	ref abi.TurnRef, stream *streamBuf, log *slog.Logger) *journalCaller {
	c := &journalCaller{h: h, exec: exec, stream: stream, agent: agent, key: key, caps: caps, ref: ref, log: log}
	c.budget = calls.NewBudget(caps.Limits, func(ctx context.Context) (int64, error) {
		now := time.Now().UTC()
		return h.st.AgentTokensSince(ctx, agent.UID, time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC))
	})
	return c
}

// setRef makes ref (a newer revision of the attempt's delivery, after a
// steer) the one later journal writes are fenced by.
func (c *journalCaller) setRef(ref abi.TurnRef) {
	c.refMu.Lock()
	c.ref = ref
	c.refMu.Unlock()
	if c.stream != nil {
		c.stream.setRef(ref)
	}
}

func (c *journalCaller) currentRef() abi.TurnRef {
	c.refMu.Lock()
	defer c.refMu.Unlock()
	return c.ref
}

// Call performs one host call of the attempt (abi.Caller).
func (c *journalCaller) Call(ctx context.Context, req *abi.CallRequest) *abi.CallResult {
	if err := req.Validate(); err != nil {
		// Not numbered and not journaled: nothing was asked of anyone.
		return &abi.CallResult{Error: &abi.CallError{Code: abi.CallInvalid, Message: err.Error()}}
	}
	if req.Kind == abi.CallKindEmit {
		if c.stream == nil {
			return abi.NoCaller()
		}
		ch := *req.Emit
		ch.CallSeq = 0 // the host's to set
		return c.stream.emit(ch)
	}
	if c.exec == nil {
		return abi.NoCaller()
	}
	digest, err := RequestDigest(req)
	if err != nil {
		return &abi.CallResult{Error: &abi.CallError{Code: abi.CallInvalid, Message: err.Error()}}
	}
	if c.promote != nil {
		// A deferred turn is written before its first call: the journal
		// records under its delivery, and the request leaves the host.
		if err := c.promote(ctx); err != nil {
			return cancelled("the turn could not be written before its host call")
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	seq := c.seq
	ctx, span := c.h.startHostCall(ctx, c.span, seq, string(req.Kind))
	res := c.call(ctx, seq, req, digest)
	endHostCall(span, res)
	return res
}

// call answers call seq: from the journal, or live and then recorded.
func (c *journalCaller) call(ctx context.Context, seq int, req *abi.CallRequest, digest string) *abi.CallResult {
	if !c.loaded {
		if err := c.load(ctx); err != nil {
			// Without the journal a call could be paid twice: refuse it.
			c.log.Warn("host call: read the journal", "seq", seq, "err", err)
			return cancelled("the host could not read the event's journal; the call was not made")
		}
	}
	setAsideFrom := 0
	if !c.diverged {
		row, ok := c.journal[seq]
		if !ok || row.RequestDigest != digest || row.ErrorCode != "" || c.used[seq] {
			// Calls a worker makes concurrently arrive in another order on
			// a retry: a row of the same request recorded at another seq,
			// not yet replayed by this attempt, is the same call.
			row, ok = c.unusedRow(digest)
		}
		if ok {
			c.used[row.Seq] = true
			return c.replay(ctx, row)
		}
		if _, recorded := c.journal[seq]; recorded {
			c.diverged, setAsideFrom = true, seq
		} else if seq > c.lastSeq {
			// Past the end of the journal: every later call is live too.
			c.diverged = true
		}
	}
	start := time.Now()
	if what, ok := c.caps.Approval.NeedsApproval(req); ok {
		if res := c.approval(ctx, seq, req, digest, what, setAsideFrom); res != nil {
			return res
		}
		// Approved: the call goes live once, journaled as any.
	}
	opts := calls.CallOptions{
		// The digest binds the key to the request: a retry that diverges at
		// seq must not be answered from the provider's cache of another.
		Budget: c.budget, IdempotencyKey: fmt.Sprintf("%s-%d-%d-%s", c.agent.UID, c.currentRef().ActorEventID, seq, digest),
	}
	if c.stream != nil && req.Kind == abi.CallKindModel {
		// Scrubbed of secrets by the executor before they reach us.
		opts.OnDelta = func(text string) { c.stream.emitHost(text, seq) }
	}
	out := c.exec.Do(ctx, c.agent.Name, c.caps, req, opts)
	return c.record(ctx, seq, req, digest, setAsideFrom, start, out)
}

// record journals the result of call seq under the attempt's fences and
// returns it, or withholds it (cancelled) when the write is refused.
func (c *journalCaller) record(ctx context.Context, seq int, req *abi.CallRequest, digest string, setAsideFrom int,
	start time.Time, out calls.Outcome) *abi.CallResult {
	res := out.Result
	res.Seq = seq
	enc, err := json.Marshal(res)
	if err != nil {
		return cancelled("the host could not encode the call's result")
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), journalWriteTimeout)
	defer cancel()
	_, err = c.h.st.RecordHostCall(wctx, store.RecordHostCallParams{
		Ref: c.currentRef(), SetAsideFrom: setAsideFrom,
		Call: store.HostCall{
			Seq: seq, Kind: string(req.Kind), Destination: out.Destination, RequestDigest: digest, Result: enc,
			ErrorCode: string(out.ErrorCode), Status: out.Status, StartedAt: start,
			DurationMS: time.Since(start).Milliseconds(), InputTokens: out.Usage.InputTokens, OutputTokens: out.Usage.OutputTokens,
		},
	})
	if err != nil {
		return c.refused(seq, err)
	}
	return res
}

// approval decides a live call that needs approval (docs/DESIGN.md "Waits
// and approvals"): nil when an approver approved it (the call goes live);
// a denied result, journaled, when the approver rejected it or the
// approval expired; otherwise — no decision yet — the turn is ended (its
// context cancelled) so that the controller ends the attempt as a hold
// with the approval's wait, and the call answers cancelled.
func (c *journalCaller) approval(ctx context.Context, seq int, req *abi.CallRequest, digest, what string, setAsideFrom int) *abi.CallResult {
	event := c.currentRef().ActorEventID
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), journalWriteTimeout)
	defer cancel()
	decided, approvals, taken, err := c.findApproval(rctx, event, seq, digest)
	if err == nil && decided != nil && approvals > 0 {
		// An approval lets the call go out once: a call that went out
		// under it and was set aside since (the turn diverged at seq on
		// a later attempt, then came back to this request) needs a new
		// one, or a single approval could be spent again and again.
		var spent int
		if spent, err = c.approvedCallsMade(rctx, event, seq, digest); err == nil && spent >= approvals {
			decided = nil
		}
	}
	if err != nil {
		c.log.Warn("host call: read its approval", "seq", seq, "err", err)
		return cancelled("the host could not read the call's approval; the call was not made")
	}
	if decided == nil {
		if c.hold == nil {
			id := fmt.Sprintf("approval-%d-%d", event, seq)
			if taken[id] {
				// The same seq asked to approve another request before
				// (the turn diverged), or this one again (its approval
				// was spent): the new one gets its own wait.
				id += "-" + strings.TrimPrefix(digest, "sha256:")[:12]
				for n := 2; taken[id]; n++ {
					id = fmt.Sprintf("approval-%d-%d-%s-%d", event, seq, strings.TrimPrefix(digest, "sha256:")[:12], n)
				}
			}
			c.hold = &store.WaitParams{ID: id, For: clip("approve "+abi.SafeText(what), 1000), Data: approvalData(req), Timeout: c.caps.Approval.Timeout,
				CallSeq: seq, CallDigest: digest}
			if c.onHold != nil {
				c.onHold()
			}
		}
		return cancelled("this call needs an approver's decision: the turn waits for it and runs again once it is decided")
	}
	msg := "the approval of this call expired before anyone decided"
	if decided.Status == store.WaitResolved {
		var d store.ApprovalDecision
		if err := json.Unmarshal(decided.Resolution, &d); err == nil && d.Approved {
			return nil
		}
		msg = "the approver rejected this call"
		if d.Reason != "" {
			msg += ": " + abi.SafeText(d.Reason)
		}
	}
	out := calls.Outcome{Destination: what, ErrorCode: abi.CallDenied,
		Result: &abi.CallResult{Error: &abi.CallError{Code: abi.CallDenied, Reason: calls.ReasonApproval, Message: msg}}}
	return c.record(ctx, seq, req, digest, setAsideFrom, time.Now(), out)
}

// findApproval looks for the decided approval wait of call seq of the
// event with the request digest (the newest, if several); approvals
// counts those that approved it; taken are the ids of the session's
// waits.
func (c *journalCaller) findApproval(ctx context.Context, event int64, seq int, digest string) (decided *store.Wait, approvals int, taken map[string]bool, err error) {
	taken = map[string]bool{}
	p := store.ListWaitsParams{AgentUID: c.key.AgentUID, SessionID: c.key.SessionID, Limit: 500}
	for {
		pg, err := c.h.st.ListWaits(ctx, p)
		if err != nil {
			return nil, 0, nil, err
		}
		for i := range pg.Waits {
			w := pg.Waits[i]
			taken[w.ID] = true
			if w.Kind != store.WaitKindApproval || w.EventID != event {
				continue
			}
			if w.CallSeq == seq && w.CallDigest == digest && w.Status != store.WaitOpen {
				decided = &w
				var d store.ApprovalDecision
				if w.Status == store.WaitResolved && json.Unmarshal(w.Resolution, &d) == nil && d.Approved {
					approvals++
				}
			}
		}
		if len(pg.Waits) < p.Limit || pg.NextAfter == p.After {
			return decided, approvals, taken, nil
		}
		p.After = pg.NextAfter
	}
}

// approvedCallsMade counts the event's journal rows, set aside or not,
// of call seq with the request digest that went out (not refused).
func (c *journalCaller) approvedCallsMade(ctx context.Context, event int64, seq int, digest string) (int, error) {
	rows, err := c.h.st.HostCalls(ctx, c.key, event)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rows {
		if r.Seq == seq && r.RequestDigest == digest && r.ErrorCode != string(abi.CallDenied) {
			n++
		}
	}
	return n, nil
}

// approvalData is what an approval wait shows of the request: the request
// as the agent sent it — secret placeholders unfilled, never a value —
// without an http body or all but the last model message when the whole
// would pass a wait's 64 KiB.
func approvalData(req *abi.CallRequest) json.RawMessage {
	const limit = 64 << 10
	b, err := abi.Marshal(req)
	if err == nil && len(b) <= limit {
		return b
	}
	short := *req
	switch {
	case req.HTTP != nil:
		h := *req.HTTP
		h.Body = nil
		short.HTTP = &h
	case req.Model != nil:
		m := *req.Model
		m.Messages = m.Messages[len(m.Messages)-1:]
		m.Tools = nil
		short.Model = &m
	}
	if b, err := abi.Marshal(&short); err == nil && len(b) <= limit {
		return b
	}
	b, _ = abi.Marshal(map[string]string{"kind": string(req.Kind), "note": "the request is too large to show"})
	return b
}

// clip cuts s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// takeHold returns the approval wait the attempt must end with, if any.
func (c *journalCaller) takeHold() *store.WaitParams {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.hold
	c.hold = nil
	return h
}

// load reads the event's journal: its live rows by seq.
func (c *journalCaller) load(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), journalWriteTimeout)
	defer cancel()
	rows, err := c.h.st.HostCalls(rctx, c.key, c.currentRef().ActorEventID)
	if err != nil {
		return err
	}
	c.journal, c.used = map[int]store.HostCall{}, map[int]bool{}
	for _, r := range rows {
		if !r.SetAside {
			c.journal[r.Seq] = r
			c.lastSeq = max(c.lastSeq, r.Seq)
		}
	}
	c.loaded = true
	return nil
}

// replay returns a recorded result, after recording the replay under the
// attempt's fences.
func (c *journalCaller) replay(ctx context.Context, row store.HostCall) *abi.CallResult {
	var res abi.CallResult
	if err := json.Unmarshal(row.Result, &res); err != nil {
		// A row this host wrote always decodes; one that does not is not
		// replayed: the call goes live as if the attempt diverged.
		c.log.Error("host call: journal row does not decode", "seq", row.Seq, "err", err)
		return cancelled("the journal row of this call is unreadable")
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), journalWriteTimeout)
	defer cancel()
	if err := c.h.st.ReplayHostCall(wctx, c.currentRef(), row.Seq); err != nil {
		return c.refused(row.Seq, err)
	}
	c.h.metrics.HostCallsReplayed.WithLabelValues(c.agent.Name).Inc()
	res.Replayed, res.Seq = true, row.Seq
	if c.stream != nil && res.Model != nil {
		// The attempt that made the call streamed its text; this one's
		// stream gets it whole, a steer's rerun too: its stream restarted
		// (streamBuf.restart), and a client dropped the first run's text.
		c.stream.emitReplay(res.Model.Message.Content, row.Seq)
	}
	return &res
}

// refused turns a journal write that failed into the worker's answer: the
// result is withheld (a result the worker sees is always recorded).
func (c *journalCaller) refused(seq int, err error) *abi.CallResult {
	var fe *store.FenceError
	if errors.As(err, &fe) {
		c.h.metrics.HostCallsFenced.WithLabelValues(string(fe.Reason)).Inc()
		c.log.Warn("host call result refused by the fences", "seq", seq, "reason", fe.Reason)
		return cancelled(fmt.Sprintf("the attempt lost its fence (%s): its call result is not recorded and its turn will not commit", fe.Reason))
	}
	c.log.Warn("host call: record in the journal", "seq", seq, "err", err)
	return cancelled("the host could not record the call in the journal; the result is withheld")
}

func cancelled(msg string) *abi.CallResult {
	return &abi.CallResult{Error: &abi.CallError{Code: abi.CallCancelled, Message: msg}}
}

// RequestDigest is the journal's request digest of a host call:
// "sha256:<hex>" of its canonical JSON (store.CanonicalJSON), taken as the
// agent sent it — secret placeholders unfilled, so it never depends on a
// secret's value.
func RequestDigest(req *abi.CallRequest) (string, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("encode the call request: %w", err)
	}
	canon, err := store.CanonicalJSON(b)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
