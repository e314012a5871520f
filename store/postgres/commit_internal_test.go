package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// TestCommitOfAnEventClosedUnderItIsRefused: the commit's writes refuse
// when its event is no longer open though the fence passed (the event
// closed by a writer that skipped the activation's lock — a bug this
// guard contains): superseded_delivery, and nothing of the commit written —
// neither the fence's own updates nor the turn — with the dispatched
// payloads (the one-statement writes) and without.
func TestCommitOfAnEventClosedUnderItIsRefused(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "sha256:closed", ABIVersion: abi.Version, Bytes: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "closed", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	for _, payloads := range []bool{true, false} {
		sess, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		key := sess.ActorKey
		if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: json.RawMessage(`{"message":"hi"}`)}); err != nil {
			t.Fatal(err)
		}
		act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "h", LeaseTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: m.Digest, MarkSent: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.pool.Exec(ctx, `UPDATE actor_events SET status = 'cancelled' WHERE event_id = $1`, d.Event.ID); err != nil {
			t.Fatal(err)
		}
		p := store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "MUST NOT BE WRITTEN"}}}
		if payloads {
			p.Payloads = []string{string(d.Event.Payload)}
		}
		_, err = s.CommitTurn(ctx, p)
		var fe *store.FenceError
		if !errors.As(err, &fe) || fe.Reason != store.FenceSupersededDelivery {
			t.Fatalf("payloads %v: commit of a closed event: %v, want a superseded_delivery FenceError", payloads, err)
		}
		var state string
		var current *int64
		var turns int
		if err := s.pool.QueryRow(ctx, `SELECT d.state, a.current_event_id, (SELECT count(*) FROM turns WHERE event_id = $3)
			FROM deliveries d, activations a WHERE d.delivery_id = $1 AND a.activation_uid = $2`,
			d.Delivery.ID, act.UID, d.Event.ID).Scan(&state, &current, &turns); err != nil {
			t.Fatal(err)
		}
		if state != "sent" || current == nil || *current != d.Event.ID || turns != 0 {
			t.Fatalf("payloads %v: after the refusal: delivery %s, current event %v, turns %d; want sent, %d, 0",
				payloads, state, current, turns, d.Event.ID)
		}
	}
}
