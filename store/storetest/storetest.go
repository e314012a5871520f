// Package storetest is the one conformance suite every store driver runs:
// each docs/DESIGN.md invariant the store decides, and the behaviour of every
// store.Store method, through the interface only.
//
// A driver's test calls
//
//	func TestConformance(t *testing.T) {
//		storetest.Exercise(t, func(t *testing.T) store.Store { ... })
//	}
//
// newStore must return a fresh, empty, migrated store for each call and
// register its Close with t.Cleanup. Cases run in parallel, each on its own
// store. The fence classification order the suite asserts is written down in
// README.md beside this file.
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Lease TTLs used by the suite. ShortTTL and SetupTTL are the ones the
// suite waits out; LongTTL never expires during a test. SetupTTL is for a
// test that claims several activations and dispatches on each before any
// lease may lapse: on a loaded CI machine (2 cores, -race, packages in
// parallel) that setup has taken longer than ShortTTL: a test that
// dispatches (or commits) under a lease before waiting it out claims with
// SetupTTL.
const (
	ShortTTL = 300 * time.Millisecond
	SetupTTL = 3 * time.Second
	LongTTL  = 10 * time.Minute
)

type testCase struct {
	name string
	fn   func(t *testing.T, b *bundle)
}

// Exercise runs every conformance case against stores made by newStore.
// Subtests are named for the rule they check.
func Exercise(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	groups := [][]testCase{
		catalogCases(),
		pluginCases(),
		eventCases(),
		activationCases(),
		fenceCases(),
		turnCases(),
		commitNextCases(),
		deferredCases(),
		deferredAttackCases(),
		claimFirstCases(),
		commitNextEdgeCases(),
		onetripCases(),
		maintenanceCases(),
		crashCases(),
		sleepCases(),
		deadLetterCases(),
		steerCases(),
		cancelCases(),
		midTurnCases(),
		alarmCases(),
		hostCallCases(),
		streamCases(),
		hammerCases(),
		consoleCases(),
		tokenCases(),
		namespaceCases(),
	}
	for _, g := range groups {
		for _, c := range g {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.fn(t, setup(t, newStore))
			})
		}
	}
}

// ExerciseDeferred runs only the deferred-dispatch cases (Deferred/…),
// for a driver's other configuration of the same paths (PostgreSQL
// without its group commit).
func ExerciseDeferred(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	for _, c := range append(deferredCases(), deferredAttackCases()...) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, setup(t, newStore))
		})
	}
}

// bundle is one case's store with a registered module and agent.
type bundle struct {
	t     *testing.T
	ctx   context.Context
	s     store.Store
	agent store.Agent
	host  string
}

func setup(t *testing.T, newStore func(t *testing.T) store.Store) *bundle {
	t.Helper()
	b := &bundle{t: t, ctx: t.Context(), s: newStore(t), host: "host-" + uuid.NewString()[:8]}
	m := b.module("agent module")
	b.agent = b.newAgent("agent-"+uuid.NewString()[:8], m.Digest, store.CrashRestart)
	return b
}

// digest is the content address of b.
func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (b *bundle) module(content string) store.Module {
	b.t.Helper()
	data := []byte("\x00asm\x01\x00\x00\x00" + content)
	m, _, err := b.s.PutModule(b.ctx, store.PutModuleParams{Digest: digest(data), ABIVersion: abi.Version, Bytes: data})
	noErr(b.t, err, "PutModule")
	return m
}

func (b *bundle) newAgent(name, moduleDigest string, policy store.CrashPolicy) store.Agent {
	b.t.Helper()
	a, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: name, ModuleDigest: moduleDigest, CrashPolicy: policy,
	})
	noErr(b.t, err, "CreateAgent")
	return a
}

// session creates a session of the bundle's agent (crash policy restart).
func (b *bundle) session() store.ActorKey {
	b.t.Helper()
	return b.sessionWith(store.CrashRestart)
}

// sessionWith creates a session of the bundle's agent with a crash policy.
func (b *bundle) sessionWith(policy store.CrashPolicy) store.ActorKey {
	b.t.Helper()
	return b.sessionOf(b.agent.UID, policy)
}

// sessionOf creates a session of an agent with a crash policy.
func (b *bundle) sessionOf(agentUID string, policy store.CrashPolicy) store.ActorKey {
	b.t.Helper()
	s, created, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{
		AgentUID: agentUID, SessionID: uuid.NewString(), CrashPolicy: policy,
	})
	noErr(b.t, err, "CreateSession")
	if !created {
		b.t.Fatalf("CreateSession: created = false for a new session")
	}
	return s.ActorKey
}

// message appends a message signal.
func (b *bundle) message(key store.ActorKey, text string) store.Event {
	b.t.Helper()
	payload, err := json.Marshal(map[string]string{"message": text})
	noErr(b.t, err, "marshal payload")
	ev, created, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload})
	noErr(b.t, err, "AppendEvent")
	if !created {
		b.t.Fatalf("AppendEvent: created = false without an idempotency key")
	}
	return ev
}

func (b *bundle) claimOn(key store.ActorKey, host string, ttl time.Duration) store.Activation {
	b.t.Helper()
	a, err := b.s.ClaimActivation(b.ctx, store.ClaimActivationParams{
		Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: host, LeaseTTL: ttl,
	})
	noErr(b.t, err, "ClaimActivation")
	return a
}

func (b *bundle) claim(key store.ActorKey, ttl time.Duration) store.Activation {
	b.t.Helper()
	return b.claimOn(key, b.host, ttl)
}

func (b *bundle) tryNext(act store.Activation, markSent bool, binding string) (store.Dispatch, error) {
	return b.s.NextDelivery(b.ctx, store.NextDeliveryParams{
		Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: binding, MarkSent: markSent, TailMessages: 10,
	})
}

// next takes the next due event under act, marked sent.
func (b *bundle) next(act store.Activation) store.Dispatch {
	b.t.Helper()
	d, err := b.tryNext(act, true, b.agent.ModuleDigest)
	noErr(b.t, err, "NextDelivery")
	return d
}

// commit commits ref with one assistant reply and state.
func (b *bundle) commit(ref abi.TurnRef, reply, state string) store.Turn {
	b.t.Helper()
	t, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{
		Ref: ref, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}}, State: []byte(state), Outcome: abi.OutcomeOK,
	})
	noErr(b.t, err, "CommitTurn")
	return t
}

func (b *bundle) fail(ref abi.TurnRef, counted bool, backoff time.Duration, maxAttempts int) store.FailResult {
	b.t.Helper()
	fr, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{
		Ref: ref, Error: "worker crashed", Counted: counted, Backoff: backoff, MaxAttempts: maxAttempts,
	})
	noErr(b.t, err, "FailAttempt")
	return fr
}

func (b *bundle) getSession(key store.ActorKey) store.Session {
	b.t.Helper()
	s, err := b.s.GetSession(b.ctx, key)
	noErr(b.t, err, "GetSession")
	return s
}

func (b *bundle) events(key store.ActorKey) []store.Event {
	b.t.Helper()
	evs, err := b.s.ListEvents(b.ctx, store.ListEventsParams{Key: key, Limit: 1000})
	noErr(b.t, err, "ListEvents")
	return evs
}

func (b *bundle) event(key store.ActorKey, id int64) store.Event {
	b.t.Helper()
	for _, ev := range b.events(key) {
		if ev.ID == id {
			return ev
		}
	}
	b.t.Fatalf("event %d of %s not listed", id, key)
	return store.Event{}
}

func (b *bundle) alarms(key store.ActorKey) []store.Alarm {
	b.t.Helper()
	as, err := b.s.ListAlarms(b.ctx, key)
	noErr(b.t, err, "ListAlarms")
	return as
}

func (b *bundle) runnable(blocked ...string) []store.ActorKey {
	b.t.Helper()
	keys, err := b.s.RunnableSessions(b.ctx, store.RunnableSessionsParams{Limit: 1000, BlockedAgents: blocked})
	noErr(b.t, err, "RunnableSessions")
	return keys
}

func (b *bundle) transcript(key store.ActorKey) []store.Turn {
	b.t.Helper()
	turns, err := b.s.Transcript(b.ctx, store.TranscriptParams{Key: key, Limit: 1000})
	noErr(b.t, err, "Transcript")
	return turns
}

// waitExpired sleeps past the lease of every activation (the one sleep the
// suite allows), then waits until the store's clock agrees.
func (b *bundle) waitExpired(acts ...store.Activation) {
	b.t.Helper()
	time.Sleep(ShortTTL)
	deadline := time.Now().Add(10 * time.Second)
	for {
		expired, err := b.s.ExpiredActivations(b.ctx, 1000)
		noErr(b.t, err, "ExpiredActivations")
		missing := 0
		for _, a := range acts {
			if !slices.Contains(expired, a.Ref()) {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%d activations still unexpired 10 s after their %v lease", missing, ShortTTL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// snapshot renders everything a rejected write must leave unchanged: the
// session's counters, every event with its error chain and its host-call
// journal (every row, set-aside ones included), the alarms, and the
// transcript with each turn's usage.
func (b *bundle) snapshot(key store.ActorKey) string {
	b.t.Helper()
	var sb strings.Builder
	s := b.getSession(key)
	fmt.Fprintf(&sb, "session %s status=%s epoch=%d turns=%d events=%d open=%d dead=%d sleep=%s/%q destroy=%s pending=%s\n",
		key, s.Status, s.ActorEpoch, s.TurnCount, s.EventCount, s.OpenEvents, s.DeadLetters,
		tsp(s.SleepTS), s.SleepReason, tsp(s.DestroyTS), tsp(s.PendingSince))
	for _, ev := range b.events(key) {
		fmt.Fprintf(&sb, "event %d seq=%d kind=%s status=%s attempts=%d next=%s err=%q binding=%q closed=%s steer_of=%d redrives=%d\n",
			ev.ID, ev.Seq, ev.Kind, ev.Status, ev.Attempts, ts(ev.NextAttemptAt), ev.LastError, ev.Binding, tsp(ev.ClosedAt),
			ev.SteerOf, ev.Redrives)
		chain, err := b.s.EventErrors(b.ctx, key, ev.ID)
		noErr(b.t, err, "EventErrors")
		for _, e := range chain {
			fmt.Fprintf(&sb, "  error attempt=%d epoch=%d counted=%v at=%s %q\n", e.Attempt, e.ActorEpoch, e.Counted, ts(e.FailedAt), e.Error)
		}
		calls, err := b.s.HostCalls(b.ctx, key, ev.ID)
		noErr(b.t, err, "HostCalls")
		for _, c := range calls {
			fmt.Fprintf(&sb, "  call %s\n", renderCall(c))
		}
	}
	for _, a := range b.alarms(key) {
		fmt.Fprintf(&sb, "alarm %s due=%s every=%d data=%s set=%s\n", a.Name, ts(a.DueAt), a.EveryMs, a.Data, ts(a.SetAt))
	}
	for _, t := range b.transcript(key) {
		fmt.Fprintf(&sb, "turn %d event=%d delivery=%s epoch=%d outcome=%s at=%s usage=%d/%d\n",
			t.TurnNo, t.EventID, t.DeliveryID, t.ActorEpoch, t.Outcome, ts(t.CommittedAt),
			t.Usage.InputTokens, t.Usage.OutputTokens)
		for _, m := range t.Messages {
			fmt.Fprintf(&sb, "  %d %s %q\n", m.Index, m.Role, m.Content)
		}
	}
	return sb.String()
}

func (b *bundle) sameSnapshot(key store.ActorKey, before, what string) {
	b.t.Helper()
	if after := b.snapshot(key); after != before {
		b.t.Fatalf("%s wrote to %s:\nbefore:\n%s\nafter:\n%s", what, key, before, after)
	}
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func tsp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return ts(*t)
}

// noErr fails the test now if err is not nil.
func noErr(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: unexpected error: %v", what, err)
	}
}

// wantIs fails unless errors.Is(err, target).
func wantIs(t testing.TB, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error = %v, want %v", what, err, target)
	}
}

// wantFence fails unless err is a *store.FenceError with reason.
func wantFence(t testing.TB, err error, reason store.FenceReason, what string) {
	t.Helper()
	var fe *store.FenceError
	if !errors.As(err, &fe) {
		t.Fatalf("%s: error = %v, want a *store.FenceError (%s)", what, err, reason)
	}
	if !errors.Is(err, store.ErrFence) {
		t.Fatalf("%s: errors.Is(err, store.ErrFence) = false for %v", what, err)
	}
	if fe.Reason != reason {
		t.Fatalf("%s: fence reason = %s (%s), want %s", what, fe.Reason, fe.Detail, reason)
	}
}

// wantNoDue fails unless err is a *store.NoDueEventError; it returns it.
func wantNoDue(t testing.TB, err error, what string) *store.NoDueEventError {
	t.Helper()
	var nd *store.NoDueEventError
	if !errors.As(err, &nd) {
		t.Fatalf("%s: error = %v, want a *store.NoDueEventError", what, err)
	}
	return nd
}

func wantEq[T comparable](t testing.TB, got, want T, what string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func wantBytes(t testing.TB, got, want []byte, what string) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s = %q, want %q", what, got, want)
	}
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return bytes.Equal(ja, jb)
}

// wantMessages compares a turn's messages with role/content pairs.
func wantMessages(t testing.TB, got []store.TranscriptMessage, want ...string) {
	t.Helper()
	if len(got) != len(want)/2 {
		t.Fatalf("messages = %+v, want %q", got, want)
	}
	for i, m := range got {
		if m.Index != i || m.Role != want[2*i] || m.Content != want[2*i+1] {
			t.Fatalf("message %d = %+v, want {%d %s %q} (all: %+v)", i, m, i, want[2*i], want[2*i+1], got)
		}
	}
}
