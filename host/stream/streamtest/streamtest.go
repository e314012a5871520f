// Package streamtest writes real frames to session streams for tests,
// through the store's own writes and fences, without a host: NextDelivery
// writes turn.started, AppendChunks a chunk frame, CommitTurn
// turn.committed, FailAttempt turn.retrying. Its turns are claimed under
// a long lease, so a host running beside it leaves those sessions alone.
package streamtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Writer drives turns of one agent's sessions directly on a store.
type Writer struct {
	t     testing.TB
	ctx   context.Context
	St    store.Store
	Agent store.Agent
	held  map[store.ActorKey]store.Activation
}

// New registers a module and an agent (name: a random "s…" name) on st.
func New(t testing.TB, st store.Store) *Writer {
	t.Helper()
	return NewAgent(t, st, "s"+uuid.NewString()[:8])
}

// NewAgent is New with the agent's name.
func NewAgent(t testing.TB, st store.Store, name string) *Writer {
	t.Helper()
	w := &Writer{t: t, ctx: context.Background(), St: st, held: map[store.ActorKey]store.Activation{}}
	data := []byte("\x00asm\x01\x00\x00\x00stream")
	sum := sha256.Sum256(data)
	m, _, err := st.PutModule(w.ctx, store.PutModuleParams{Digest: "sha256:" + hex.EncodeToString(sum[:]), ABIVersion: abi.Version, Bytes: data})
	w.no(err)
	w.Agent, err = st.CreateAgent(w.ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: name, ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	w.no(err)
	return w
}

func (w *Writer) no(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

// Session creates a session of the agent.
func (w *Writer) Session() store.ActorKey {
	w.t.Helper()
	x, _, err := w.St.CreateSession(w.ctx, store.CreateSessionParams{AgentUID: w.Agent.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart})
	w.no(err)
	return x.ActorKey
}

// Turn is one attempt in flight.
type Turn struct {
	w        *Writer
	Act      store.Activation
	Dispatch store.Dispatch
	offset   int
}

// Start claims the session, appends a message and starts its turn (frame
// turn.started).
func (w *Writer) Start(key store.ActorKey, msg string) *Turn {
	w.t.Helper()
	act := w.claim(key)
	_, _, err := w.St.AppendEvent(w.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: json.RawMessage(fmt.Sprintf(`{"message":%q}`, msg))})
	w.no(err)
	return w.next(act)
}

// Restart takes the session's next due event (the retry of a failed
// attempt, once its backoff passed) under the activation Fail claimed
// (else a new one), waiting until it is due.
func (w *Writer) Restart(key store.ActorKey) *Turn {
	w.t.Helper()
	act, ok := w.held[key]
	delete(w.held, key)
	if !ok {
		act = w.claim(key)
	}
	for i := 0; ; i++ {
		d, err := w.St.NextDelivery(w.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: w.Agent.ModuleDigest, MarkSent: true, TailMessages: 10})
		if _, ok := errors.AsType[*store.NoDueEventError](err); ok && i < 1000 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		w.no(err)
		return &Turn{w: w, Act: act, Dispatch: d}
	}
}

func (w *Writer) claim(key store.ActorKey) store.Activation {
	act, err := w.St.ClaimActivation(w.ctx, store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "streamtest", LeaseTTL: time.Hour})
	w.no(err)
	return act
}

func (w *Writer) next(act store.Activation) *Turn {
	w.t.Helper()
	d, err := w.St.NextDelivery(w.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: w.Agent.ModuleDigest, MarkSent: true, TailMessages: 10})
	w.no(err)
	return &Turn{w: w, Act: act, Dispatch: d}
}

// EventID is the turn's event.
func (tr *Turn) EventID() int64 { return tr.Dispatch.Event.ID }

// Emit appends one chunk frame of text chunks.
func (tr *Turn) Emit(texts ...string) store.Frame {
	tr.w.t.Helper()
	var cs []abi.Chunk
	for _, s := range texts {
		cs = append(cs, abi.Chunk{Type: abi.ChunkText, Text: s})
	}
	f, err := tr.w.St.AppendChunks(tr.w.ctx, store.AppendChunksParams{Ref: tr.Dispatch.Delivery.TurnRef(), Attempt: tr.Dispatch.Attempt, Offset: tr.offset, Chunks: cs})
	tr.w.no(err)
	tr.offset += len(cs)
	return f
}

// Commit commits the turn with one assistant reply (frame
// turn.committed) and stops the activation.
func (tr *Turn) Commit(reply string) {
	tr.w.t.Helper()
	tr.CommitWith(store.CommitTurnParams{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}}, Outcome: abi.OutcomeOK})
}

// CommitWith commits the turn with p (its Ref filled in) and stops the
// activation.
func (tr *Turn) CommitWith(p store.CommitTurnParams) {
	tr.w.t.Helper()
	p.Ref = tr.Dispatch.Delivery.TurnRef()
	_, err := tr.w.St.CommitTurn(tr.w.ctx, p)
	tr.w.no(err)
	tr.w.no(tr.w.St.StopActivation(tr.w.ctx, tr.Act.Ref()))
}

// Fail fails the attempt, counted, with a 1 ms backoff (frame
// turn.retrying), and claims the session again at once for Restart (so
// that a host running beside the test does not take the retry).
func (tr *Turn) Fail(errText string) {
	tr.w.t.Helper()
	_, err := tr.w.St.FailAttempt(tr.w.ctx, store.FailAttemptParams{Ref: tr.Dispatch.Delivery.TurnRef(), Error: errText, Counted: true, Backoff: time.Millisecond, MaxAttempts: 5})
	tr.w.no(err)
	tr.w.held[store.KeyOf(tr.Dispatch.Delivery.TurnRef())] = tr.w.claim(store.KeyOf(tr.Dispatch.Delivery.TurnRef()))
}

// FailFinal fails the attempt, counted, as its last (frame turn.failed,
// dead letter).
func (tr *Turn) FailFinal(errText string) {
	tr.w.t.Helper()
	_, err := tr.w.St.FailAttempt(tr.w.ctx, store.FailAttemptParams{Ref: tr.Dispatch.Delivery.TurnRef(), Error: errText, Counted: true, Backoff: time.Millisecond, MaxAttempts: 1})
	tr.w.no(err)
}

// CommitWait commits the turn with outcome wait, opening wait w (frames
// turn.committed, wait.opened).
func (tr *Turn) CommitWait(w store.WaitParams) {
	tr.w.t.Helper()
	tr.CommitWith(store.CommitTurnParams{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "waiting: " + w.For}}, Outcome: abi.OutcomeWait, Wait: &w})
}

// Hold ends the attempt as an approval wait w for host call w.CallSeq
// (frames turn.retrying with reason approval, wait.opened) and stops the
// activation.
func (tr *Turn) Hold(w store.WaitParams) {
	tr.w.t.Helper()
	_, err := tr.w.St.FailAttempt(tr.w.ctx, store.FailAttemptParams{Ref: tr.Dispatch.Delivery.TurnRef(), Error: "needs approval", Hold: &w})
	tr.w.no(err)
}
