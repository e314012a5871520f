package postgres

import (
	"testing"

	"github.com/paddock-dev/paddock/store"
)

// TestParseWakeupTellsOwnEchoes: a notification payload names its key,
// tagged or not, and only this Store value's origin makes it an echo.
func TestParseWakeupTellsOwnEchoes(t *testing.T) {
	s := &Store{origin: "0123456789abcdef"}
	key := store.ActorKey{AgentUID: "5f0c6a8e-1f1d-4b8e-9a55-0a4c1b2d3e4f", SessionID: "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"}
	for _, c := range []struct {
		payload string
		want    store.Wakeup
		ok      bool
	}{
		{key.String(), store.Wakeup{Key: key}, true},
		{"0123456789abcdef:42:" + key.String(), store.Wakeup{Key: key, EchoSeq: 42}, true},
		{"fedcba9876543210:42:" + key.String(), store.Wakeup{Key: key}, true},
		// A session id is the part after the first '/', whatever it holds.
		{"0123456789abcdef:7:a/b:c/d", store.Wakeup{Key: store.ActorKey{AgentUID: "a", SessionID: "b:c/d"}, EchoSeq: 7}, true},
		{"0123456789abcdef:x:" + key.String(), store.Wakeup{}, false},
		{"0123456789abcdef:0:" + key.String(), store.Wakeup{}, false},
		{"0123456789abcdef:1:/s", store.Wakeup{}, false},
		{"nokey", store.Wakeup{}, false},
		{"a/", store.Wakeup{}, false},
		{"/s", store.Wakeup{}, false},
	} {
		w, ok := s.parseWakeup(c.payload)
		if ok != c.ok || w != c.want {
			t.Errorf("parseWakeup(%q) = %+v, %v; want %+v, %v", c.payload, w, ok, c.want, c.ok)
		}
	}
}
