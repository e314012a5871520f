package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host/api"
)

func TestSteerCancelAndWakeSignalsThroughTheAPI(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setupFaulty()
		_, s := e.json("POST", "/v1/agents/faulty/sessions", `{}`)
		base := "/v1/agents/faulty/sessions/" + s["session_id"].(string)
		if c, b := e.json("POST", base+"/signals", `{"kind":"cancel"}`); c != 409 {
			t.Errorf("cancel with nothing in flight: %d %v, want 409", c, b)
		}
		e.json("POST", base+"/signals", `{"message":"think 20000"}`)
		e.waitSession(base+"/events", "the turn to start", func(m map[string]any) bool {
			evs, _ := m["events"].([]any)
			return len(evs) == 1 && evs[0].(map[string]any)["binding"] != nil
		})
		time.Sleep(200 * time.Millisecond)
		c, b := e.json("POST", base+"/signals", `{"kind":"steer","message":"stop thinking"}`)
		if c != 202 || b["in_flight"] != true {
			t.Fatalf("steer: %d %v", c, b)
		}
		var reply string
		deadline := time.Now().Add(time.Minute)
		for reply == "" && time.Now().Before(deadline) {
			_, tr := e.json("GET", base+"/transcript?wait=5s", "")
			if ts, _ := tr["turns"].([]any); len(ts) == 1 {
				ms := ts[0].(map[string]any)["messages"].([]any)
				reply = ms[len(ms)-1].(map[string]any)["content"].(string)
			}
		}
		if reply != "steered: stop thinking" {
			t.Errorf("reply after the steer: %q", reply)
		}

		// cancel a turn in flight
		e.json("POST", base+"/signals", `{"message":"think 20000"}`)
		time.Sleep(300 * time.Millisecond)
		if c, b := e.json("POST", base+"/signals", `{"kind":"cancel"}`); c != 202 || b["in_flight"] != true {
			t.Errorf("cancel: %d %v", c, b)
		}
		e.waitSession(base, "the cancelled turn", func(m map[string]any) bool { return m["open_events"] == float64(0) })
		_, tr := e.json("GET", base+"/transcript?after=1", "")
		ts, _ := tr["turns"].([]any)
		if len(ts) != 1 || ts[0].(map[string]any)["outcome"] != "cancelled" {
			t.Errorf("transcript after cancel: %v", tr)
		}
		for _, bad := range []string{`{"kind":"reboot"}`, `{"kind":"cancel","message":"x"}`, `{"kind":"wake","event_id":3}`, `{"kind":"steer"}`,
			`{"kind":"cancel","event_id":-5}`, `{"kind":"cancel","force_allocation":true}`} {
			if c, b := e.json("POST", base+"/signals", bad); c != 400 {
				t.Errorf("%s: %d %v, want 400", bad, c, b)
			}
		}
	})
}

// TestRefusalsNameTheEventAndTheDestroyedSession checks two refusals: a
// redrive or discard of an event that is not dead-lettered answers 409
// not_dead_letter naming the event and its status (the store's conflict
// carries them), and a cancel in a destroyed session answers 410
// session_destroyed like every other signal, while a live session with no
// turn in flight still gets 409 nothing_in_flight.
func TestRefusalsNameTheEventAndTheDestroyedSession(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setupFaulty()
		code, s := e.json("POST", "/v1/agents/faulty/sessions", `{"crash_policy":"restart"}`)
		if code != 201 {
			t.Fatalf("create session: %d %v", code, s)
		}
		r := "/v1/agents/faulty/sessions/" + s["session_id"].(string)
		if c, b := e.json("POST", r+"/signals", `{"message":"error"}`); c != 202 {
			t.Fatalf("signal: %d %v", c, b)
		}
		e.waitSession(r, "a dead letter", func(s map[string]any) bool { return s["dead_letters"] == float64(1) })
		_, evs := e.json("GET", r+"/events?status=dead_letter", "")
		id := int(evs["events"].([]any)[0].(map[string]any)["event_id"].(float64))
		if c, b := e.json("POST", fmt.Sprintf("%s/events/%d/discard", r, id), ""); c != 200 || b["status"] != "discarded" {
			t.Fatalf("discard: %d %v", c, b)
		}
		want := fmt.Sprintf("event %d is discarded, not dead_letter", id)
		for _, op := range []string{"discard", "redrive"} {
			c, b := e.json("POST", fmt.Sprintf("%s/events/%d/%s", r, id, op), "")
			if code, field, msg := errorOf(b); c != 409 || code != "not_dead_letter" || field != "event" || msg != want {
				t.Errorf("%s of a discarded event: %d %v, want 409 not_dead_letter %q", op, c, b, want)
			}
		}

		if c, b := e.json("POST", r+"/signals", `{"kind":"cancel"}`); c != 409 {
			t.Errorf("cancel with nothing in flight: %d %v, want 409", c, b)
		} else if code, _, _ := errorOf(b); code != "nothing_in_flight" {
			t.Errorf("cancel with nothing in flight: %v, want nothing_in_flight", b)
		}
		if c, b := e.json("DELETE", r, ""); c != 200 || b["status"] != "destroyed" {
			t.Fatalf("DELETE: %d %v", c, b)
		}
		for _, req := range [][2]string{
			{r + "/signals", `{"kind":"cancel"}`},
			{r + "/signals", fmt.Sprintf(`{"kind":"cancel","event_id":%d}`, id)},
			{fmt.Sprintf("%s/events/%d/cancel", r, id), ""},
		} {
			c, b := e.json("POST", req[0], req[1])
			if code, _, _ := errorOf(b); c != 410 || code != "session_destroyed" {
				t.Errorf("POST %s %s in a destroyed session: %d %v, want 410 session_destroyed", req[0], req[1], c, b)
			}
		}
		if c, b := e.json("POST", "/v1/agents/faulty/sessions/nope/signals", `{"kind":"cancel"}`); c != 404 {
			t.Errorf("cancel in an unknown session: %d %v, want 404", c, b)
		}
	})
}

// A signal whose encoded message exceeds MaxEventPayloadBytes is refused
// at acceptance (413, naming the field), even when api.max_body_bytes
// would let it in: accepted, it could only fail every attempt as a turn
// request too large. One just under the limit made of '<' (six bytes each
// under HTML escaping) is accepted and its turn commits.
func TestSignalsTooLargeForATurnAreRefusedAtAcceptance(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "", func(o *api.Options) { o.MaxBodyBytes = 8 << 20 })
		e.setup()
		_, s := e.json("POST", "/v1/agents/notes/sessions", `{"crash_policy":"destroy"}`)
		id := s["session_id"].(string)
		sig := "/v1/agents/notes/sessions/" + id + "/signals"
		big, _ := json.Marshal(map[string]string{"message": strings.Repeat("x", api.MaxEventPayloadBytes)})
		status, body := e.do("POST", sig, "application/json", big)
		code, field, msg := errorOf(body)
		if status != 413 || code != "signal_too_large" || field != "message" || !strings.Contains(msg, fmt.Sprint(api.MaxEventPayloadBytes)) {
			t.Fatalf("oversized signal: %d %s field=%q %q; want 413 signal_too_large naming the limit", status, code, field, msg)
		}
		// 'note ' and then '<'s: the notes agent stores it; the turn must commit.
		fits, _ := json.Marshal(map[string]string{"message": "note " + strings.Repeat("<", api.MaxEventPayloadBytes-64)})
		if status, body := e.do("POST", sig, "application/json", fits); status != 202 {
			t.Fatalf("signal of %d bytes of '<': %d %v, want 202", len(fits), status, body)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			_, got := e.json("GET", "/v1/agents/notes/sessions/"+id, "")
			if got["turn_count"] == float64(1) && got["status"] == "active" {
				break
			}
			if time.Now().After(deadline) || got["status"] == "destroyed" {
				_, evs := e.json("GET", "/v1/agents/notes/sessions/"+id+"/events", "")
				t.Fatalf("the '<' signal's turn did not commit: session %v; events %.600v", got, evs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestMidTurnRejectAndAnInvalidMidTurnThroughTheAPI: a message with
// mid_turn reject while a turn is in flight answers 409 turn_in_flight and
// writes no event; a mid_turn that is not a policy, or on another kind,
// answers 400 naming mid_turn.
func TestMidTurnRejectAndAnInvalidMidTurnThroughTheAPI(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setupFaulty()
		_, s := e.json("POST", "/v1/agents/faulty/sessions", `{}`)
		base := "/v1/agents/faulty/sessions/" + s["session_id"].(string)
		for _, bad := range []string{`{"message":"x","mid_turn":"later"}`, `{"kind":"steer","message":"x","mid_turn":"queue"}`, `{"kind":"cancel","mid_turn":"reject"}`} {
			c, b := e.json("POST", base+"/signals", bad)
			if code, field, _ := errorOf(b); c != 400 || field != "mid_turn" || code != "invalid_field" {
				t.Errorf("%s: %d %v, want 400 invalid_field naming mid_turn", bad, c, b)
			}
		}
		// Nothing in flight: accepted under reject.
		if c, b := e.json("POST", base+"/signals", `{"message":"think 20000","mid_turn":"reject"}`); c != 202 || b["mid_turn"] != "reject" {
			t.Fatalf("reject with nothing in flight: %d %v", c, b)
		}
		e.waitSession(base+"/events", "the turn to start", func(m map[string]any) bool {
			evs, _ := m["events"].([]any)
			return len(evs) == 1 && evs[0].(map[string]any)["binding"] != nil
		})
		time.Sleep(200 * time.Millisecond)
		c, b := e.json("POST", base+"/signals", `{"message":"not now","mid_turn":"reject"}`)
		if code, field, _ := errorOf(b); c != 409 || code != "turn_in_flight" || field != "mid_turn" {
			t.Fatalf("reject while a turn is in flight: %d %v, want 409 turn_in_flight", c, b)
		}
		if _, evs := e.json("GET", base+"/events", ""); len(evs["events"].([]any)) != 1 {
			t.Errorf("events after the refusal: %v, want only the one in flight", evs)
		}
		if c, b := e.json("POST", base+"/signals", `{"kind":"cancel"}`); c != 202 || b["in_flight"] != true {
			t.Errorf("cancel: %d %v", c, b)
		}
	})
}
