package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/store/storetest"
)

// open opens a fresh database file in t's temp dir and closes it at cleanup.
func open(t testing.TB) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "paddock.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) store.Store { return open(t) })
}

func TestOpenTwiceMigratesOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db with spaces?and#marks.db")
	for range 2 {
		s, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatalf("sqlite.Open: %v", err)
		}
		if got := s.Driver(); got != "sqlite" {
			t.Fatalf("Driver() = %q", got)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
}

func TestOpenFileURI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uri.db")
	s, err := sqlite.Open(t.Context(), "file:"+path+"?_txlock=deferred&_pragma=cache_size(-4000)")
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer s.Close()
	if _, err := s.ListModules(t.Context(), store.DefaultNamespace); err != nil {
		t.Fatalf("ListModules: %v", err)
	}
}

func TestOpenRefusesMemory(t *testing.T) {
	_, err := sqlite.Open(t.Context(), ":memory:")
	if err == nil || !strings.HasPrefix(err.Error(), "store/sqlite: open: ") {
		t.Fatalf("Open(:memory:) error = %v, want a store/sqlite: open: error", err)
	}
}

// A database file serves one Store at a time: a second Open is refused,
// naming the file and the holder, and the file opens again once the first
// Store closes.
func TestOpenRefusesAFileAnotherStoreHolds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "paddock.db")
	first, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	second, err := sqlite.Open(t.Context(), "file:"+path+"?_pragma=cache_size(-4000)")
	if err == nil {
		_ = second.Close()
		_ = first.Close()
		t.Fatal("a second Open of a held file succeeded")
	}
	if !errors.Is(err, sqlite.ErrInUse) || !strings.Contains(err.Error(), path) ||
		!strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second Open: %v; want ErrInUse naming %s and pid %d", err, path, os.Getpid())
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	again, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestSubscribeEchoesTellsOwnAppends: SubscribeEchoes marks the wake-up of
// an event appended by AppendEvent or Steer with the event's seq (every
// append of a SQLite Store is its own process's), any other wake-up (here
// a wake of a sleeping session) with 0; Subscribe sees just the key.
func TestSubscribeEchoesTellsOwnAppends(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	echoes, err := s.SubscribeEchoes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "m", ABIVersion: 1, Bytes: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	a, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: "a1", Name: "echo", ModuleDigest: "m", CrashPolicy: store.CrashSleep})
	if err != nil {
		t.Fatal(err)
	}
	sess, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: "s1", CrashPolicy: store.CrashSleep})
	if err != nil {
		t.Fatal(err)
	}
	key := sess.ActorKey
	next := func(what string, want store.Wakeup) {
		t.Helper()
		select {
		case w := <-echoes:
			if w != want {
				t.Fatalf("%s: wake-up %+v, want %+v", what, w, want)
			}
		default:
			t.Fatalf("%s: no wake-up", what)
		}
		select {
		case k := <-keys:
			if k != want.Key {
				t.Fatalf("%s: Subscribe got %v, want %v", what, k, want.Key)
			}
		default:
			t.Fatalf("%s: Subscribe got nothing", what)
		}
	}
	msg := []byte(`{"message":"m"}`)
	e, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: "message", Payload: msg, IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	next("append", store.Wakeup{Key: key, EchoSeq: e.Seq})
	if _, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: "message", Payload: msg, IdempotencyKey: "k"}); err != nil || created {
		t.Fatalf("re-send: created %v, %v", created, err)
	}
	st, err := s.Steer(ctx, store.SteerParams{Key: key, Payload: msg, DeliveryID: "d1"})
	if err != nil {
		t.Fatal(err)
	}
	next("steer (a re-send before it notified nothing)", store.Wakeup{Key: key, EchoSeq: st.Event.Seq})
	if _, err := s.SleepSession(ctx, store.SleepSessionParams{Key: key, Reason: "agent"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WakeSession(ctx, key); err != nil {
		t.Fatal(err)
	}
	next("wake", store.Wakeup{Key: key})
}
