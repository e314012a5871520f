package stream_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/host/stream/streamtest"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// drivers opens a fresh store of each driver.
var drivers = map[string]func(t testing.TB) store.Store{
	"sqlite": func(t testing.TB) store.Store {
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	},
	"postgres": func(t testing.TB) store.Store {
		st, err := postgres.Open(context.Background(), pgtest.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	},
}

func eachDriver(t *testing.T, fn func(t *testing.T, st store.Store)) {
	for name, open := range drivers {
		t.Run(name, func(t *testing.T) { fn(t, open(t)) })
	}
}

// collect reads events from sub until it has n, failing after a minute.
func collect(t testing.TB, sub *stream.Subscription, n int) []stream.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []stream.Event
	for len(out) < n {
		evs, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %d of %d events: %v (got %s)", len(out), n, err, ids(out))
		}
		out = append(out, evs...)
	}
	if len(out) != n {
		t.Fatalf("got %d events, want %d: %s", len(out), n, ids(out))
	}
	return out
}

func ids(evs []stream.Event) string {
	var b []string
	for _, e := range evs {
		b = append(b, e.Name+"#"+e.ID)
	}
	return strings.Join(b, " ")
}

func wantIDs(t testing.TB, evs []stream.Event, want string) {
	t.Helper()
	if got := ids(evs); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
}

func TestCursorParseAndString(t *testing.T) {
	for _, s := range []string{"0", "1", "17", "3.0", "3.12"} {
		c, err := stream.ParseCursor(s)
		if err != nil || c.String() != s {
			t.Errorf("ParseCursor(%q) = %+v %v, String %q", s, c, err, c.String())
		}
	}
	if c, err := stream.ParseCursor(""); err != nil || !c.IsZero() {
		t.Errorf(`ParseCursor("") = %+v %v, want the zero cursor`, c, err)
	}
	for _, s := range []string{"-1", "x", "1.", ".1", "1.2.3", "1.-1", "+1", "0.1", "1e3", "99999999999999999999"} {
		if _, err := stream.ParseCursor(s); err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("ParseCursor(%q) = %v, want an error naming it", s, err)
		}
	}
}

// TestFramesInOrderAndResume: one subscriber sees every frame of a turn
// in order, chunks one event each; subscribers resuming at a frame id and
// at a chunk id get exactly the events after it.
func TestFramesInOrderAndResume(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		h := stream.New(stream.Options{Store: st})
		defer h.Close()
		key := w.Session()
		sub, err := h.Subscribe(context.Background(), key, stream.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		tr := w.Start(key, "hi")
		h.Poke(key)
		tr.Emit("a", "b")
		h.Poke(key)
		tr.Emit("c")
		tr.Commit("abc")
		h.Poke(key)
		evs := collect(t, sub, 5)
		wantIDs(t, evs, "turn.started#1 chunk#2.0 chunk#2.1 chunk#3.0 turn.committed#4")
		var c stream.ChunkData
		if err := json.Unmarshal(evs[2].Data, &c); err != nil || c.Text != "b" || c.Offset != 1 || c.Attempt != 1 || c.EventID == 0 || c.Type != "text" {
			t.Fatalf("chunk data %s: %+v %v", evs[2].Data, c, err)
		}
		var head stream.FrameHead
		var body store.TurnCommittedBody
		if json.Unmarshal(evs[4].Data, &head) != nil || json.Unmarshal(evs[4].Data, &body) != nil || head.Seq != 4 || body.TurnNo != 1 || len(body.Messages) == 0 {
			t.Fatalf("turn.committed data %s", evs[4].Data)
		}
		for _, c := range []struct{ from, want string }{
			{"2.0", "chunk#2.1 chunk#3.0 turn.committed#4"},
			{"2.1", "chunk#3.0 turn.committed#4"},
			{"2", "chunk#3.0 turn.committed#4"},
			{"1", "chunk#2.0 chunk#2.1 chunk#3.0 turn.committed#4"},
			{"3.0", "turn.committed#4"},
		} {
			cur, _ := stream.ParseCursor(c.from)
			r, err := h.Subscribe(context.Background(), key, cur)
			if err != nil {
				t.Fatal(err)
			}
			got := collect(t, r, strings.Count(c.want, "#"))
			r.Close()
			wantIDs(t, got, c.want)
		}
	})
}

// TestManySubscribersOneReader: many subscribers of one session all get
// every frame, live, in order; frames written without a Poke (another
// host) arrive through the poll.
func TestManySubscribersOneReader(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		h := stream.New(stream.Options{Store: st, PollInterval: 20 * time.Millisecond, CacheFrames: 4})
		defer h.Close()
		key := w.Session()
		const n = 50
		subs := make([]*stream.Subscription, n)
		for i := range subs {
			var err error
			if subs[i], err = h.Subscribe(context.Background(), key, stream.Cursor{}); err != nil {
				t.Fatal(err)
			}
			defer subs[i].Close()
		}
		if h.Watched() != 1 {
			t.Fatalf("watched sessions = %d, want 1", h.Watched())
		}
		tr := w.Start(key, "hi")
		for i := range 10 {
			tr.Emit(fmt.Sprint(i))
		}
		tr.Commit("done") // no Poke: the poll finds it
		var want []string
		want = append(want, "turn.started#1")
		for i := range 10 {
			want = append(want, fmt.Sprintf("chunk#%d.0", i+2))
		}
		want = append(want, "turn.committed#12")
		var wg sync.WaitGroup
		errs := make(chan string, n)
		for _, sub := range subs {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				var got []stream.Event
				for len(got) < len(want) {
					evs, err := sub.Next(ctx)
					if err != nil {
						errs <- err.Error()
						return
					}
					got = append(got, evs...)
				}
				if ids(got) != strings.Join(want, " ") {
					errs <- ids(got)
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("a subscriber got %s", e)
		}
	})
}

// TestSlowSubscriberCatchesUpFromTheStore: a subscriber that reads nothing
// while more frames than the cache holds are written still gets all of
// them, in order, once each, while another subscriber kept up.
func TestSlowSubscriberCatchesUpFromTheStore(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		h := stream.New(stream.Options{Store: st, CacheFrames: 3, PageSize: 4})
		defer h.Close()
		key := w.Session()
		slow, err := h.Subscribe(context.Background(), key, stream.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		defer slow.Close()
		fast, err := h.Subscribe(context.Background(), key, stream.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		defer fast.Close()
		tr := w.Start(key, "hi")
		h.Poke(key)
		collect(t, fast, 1)
		for i := range 20 {
			tr.Emit(fmt.Sprint(i))
			h.Poke(key)
			collect(t, fast, 1)
		}
		tr.Commit("done")
		h.Poke(key)
		collect(t, fast, 1)
		got := collect(t, slow, 22)
		for i, e := range got[1:21] {
			if e.ID != fmt.Sprintf("%d.0", i+2) {
				t.Fatalf("slow subscriber: event %d is %s", i+1, e.ID)
			}
		}
	})
}

// TestResetWhenTheResumePointWasCompacted: a cursor older than the oldest
// kept frame gets stream.reset {"oldest": n} and then the kept frames.
func TestResetWhenTheResumePointWasCompacted(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		h := stream.New(stream.Options{Store: st})
		defer h.Close()
		key := w.Session()
		tr := w.Start(key, "one")
		tr.Emit("x")
		tr.Commit("x") // frames 1–3, event closed
		n, err := st.CompactStream(context.Background(), store.CompactStreamParams{Before: time.Now().Add(time.Hour), Limit: 100})
		if err != nil || n < 3 {
			t.Fatalf("CompactStream = %d, %v", n, err)
		}
		tr = w.Start(key, "two") // frame 4
		sub, err := h.Subscribe(context.Background(), key, stream.Cursor{Seq: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		evs := collect(t, sub, 2)
		wantIDs(t, evs, "stream.reset#3 turn.started#4")
		if string(evs[0].Data) != `{"oldest":4}` {
			t.Fatalf("reset data %s", evs[0].Data)
		}
		// A fresh subscriber (no position) gets no reset.
		fresh, err := h.Subscribe(context.Background(), key, stream.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close()
		wantIDs(t, collect(t, fresh, 1), "turn.started#4")
		_ = tr
	})
}

// TestRetryFramesFollowTheirChunks: a failed attempt's turn.retrying
// follows its chunks, and the retry's chunks start again at offset 0.
func TestRetryFramesFollowTheirChunks(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		h := stream.New(stream.Options{Store: st})
		defer h.Close()
		key := w.Session()
		sub, err := h.Subscribe(context.Background(), key, stream.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		tr := w.Start(key, "hi")
		tr.Emit("partial")
		tr.Fail("boom")
		tr = w.Restart(key)
		tr.Emit("whole")
		tr.Commit("whole")
		h.Poke(key)
		evs := collect(t, sub, 6)
		wantIDs(t, evs, "turn.started#1 chunk#2.0 turn.retrying#3 turn.started#4 chunk#5.0 turn.committed#6")
		var c stream.ChunkData
		if json.Unmarshal(evs[4].Data, &c) != nil || c.Attempt != 2 || c.Offset != 0 {
			t.Fatalf("retry chunk %s", evs[4].Data)
		}
	})
}

func TestUnknownSessionIsNotFound(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		h := stream.New(stream.Options{Store: st})
		defer h.Close()
		_, err := h.Subscribe(context.Background(), store.ActorKey{AgentUID: uuid.NewString(), SessionID: uuid.NewString()}, stream.Cursor{})
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("got %v, want ErrNotFound", err)
		}
		if h.Watched() != 0 {
			t.Fatalf("a refused subscription left %d watched sessions", h.Watched())
		}
	})
}

// TestNoGoroutineLeftAfterSubscribersLeave: subscribers of many sessions
// come and go; while they are subscribed the hub runs one reader per
// session and one poller, and once they are closed (and the hub too) none
// of its goroutines is left, and the process's count is back where it
// was (the store's pool warmed up by a first round).
func TestNoGoroutineLeftAfterSubscribersLeave(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		keys := make([]store.ActorKey, 20)
		for i := range keys {
			keys[i] = w.Session()
		}
		round := func(h *stream.Hub) {
			var subs []*stream.Subscription
			for _, k := range keys {
				for range 5 {
					sub, err := h.Subscribe(context.Background(), k, stream.Cursor{})
					if err != nil {
						t.Fatal(err)
					}
					subs = append(subs, sub)
				}
			}
			if got := hubGoroutines(); got != len(keys)+1 {
				t.Errorf("%d hub goroutines with %d subscribers of %d sessions, want %d (a reader per session and the poller)", got, len(subs), len(keys), len(keys)+1)
			}
			// A subscriber blocked in Next returns when its context ends.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { _, err := subs[5].Next(ctx); done <- err }()
			cancel()
			if err := <-done; err != context.Canceled {
				t.Fatalf("Next after cancel: %v", err)
			}
			for _, s := range subs {
				s.Close()
				s.Close() // idempotent
			}
			if h.Watched() != 0 {
				t.Fatalf("%d sessions still watched after every subscriber closed", h.Watched())
			}
			if got := waitHubGoroutines(0); got != 0 {
				t.Errorf("%d hub goroutines left after every subscriber closed", got)
			}
		}
		warm := stream.New(stream.Options{Store: st, PollInterval: 5 * time.Millisecond})
		round(warm)
		warm.Close()
		before := stableGoroutines()
		h := stream.New(stream.Options{Store: st, PollInterval: 5 * time.Millisecond})
		round(h)
		h.Close()
		if got := goroutinesAtMost(before); got > before {
			t.Errorf("%d goroutines after Close, %d before", got, before)
		}
	})
}

// hubGoroutines counts the goroutines the hub started (its readers and
// its poller).
func hubGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		// The "created by" line is printed even when a deep stack's middle
		// frames are elided.
		if strings.Contains(g, "created by github.com/paddock-dev/paddock/host/stream.(*Hub).Subscribe") {
			count++
		}
	}
	return count
}

// waitHubGoroutines waits (up to 10 s) for the hub's goroutines to fall to
// n and returns their count.
func waitHubGoroutines(n int) int {
	m := hubGoroutines()
	for i := 0; i < 1000 && m > n; i++ {
		time.Sleep(10 * time.Millisecond)
		m = hubGoroutines()
	}
	return m
}

// stableGoroutines returns the goroutine count once it stopped changing.
func stableGoroutines() int {
	n := runtime.NumGoroutine()
	for i := 0; i < 200; i++ {
		time.Sleep(10 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n && i >= 5 {
			return n
		}
		n = m
	}
	return n
}

// goroutinesAtMost waits (up to 10 s) for the goroutine count to fall to
// n and returns it (goroutines told to end take a moment to return).
func goroutinesAtMost(n int) int {
	m := runtime.NumGoroutine()
	for i := 0; i < 1000 && m > n; i++ {
		time.Sleep(10 * time.Millisecond)
		m = runtime.NumGoroutine()
	}
	return m
}
