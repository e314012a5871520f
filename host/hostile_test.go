package host_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// The hostile-module suite: a wasm agent (host/testdata/hostile) that
// attacks its sandbox — memory bombs, an infinite loop, runaway recursion,
// a result far over the limit, and attempts to reach files, sockets and the
// environment — runs next to a well-behaved notes session on one host.
// Every attack must end as a failed attempt with a specific reason, leak
// nothing of the host, and leave the other session committing turns.

// Limits of the suite's sandbox: small, so that the attacks end fast.
const (
	hostileMemoryPages = 512 // 32 MiB
	hostileResultBytes = 64 << 10
	// loopTurnTimeout is the turn timeout of the agent that runs the loop
	// (its policy; the other agents have a minute, so that no other attack
	// ends as a timeout on a loaded machine). It is also the window in
	// which the notes session must commit while the loop spins.
	loopTurnTimeout = 8 * time.Second
)

// hostileModules is one wasm runtime for the test binary with both modules
// loaded (compiled once into wasmtest.CacheDir: a cold compile under -race
// takes a minute or more).
type hostileModules struct {
	rt                   *wasm.Runtime
	hostile, notes       []byte
	hostileDig, notesDig string
}

var (
	hostileOnce sync.Once
	hostileMods *hostileModules
	hostileErr  error
)

func loadHostile(t *testing.T) *hostileModules {
	t.Helper()
	_, hostile := wasmtest.BuildExample(t, wasmtest.Hostile)
	_, notes := wasmtest.BuildExample(t, wasmtest.Notes)
	dir := wasmtest.CacheDir(t)
	hostileOnce.Do(func() {
		ctx := context.Background()
		rt, err := wasm.New(ctx, wasm.Config{
			CacheDir: dir, MemoryLimitPages: hostileMemoryPages, MaxResultBytes: hostileResultBytes,
			TurnTimeout: time.Minute, // the host's per-agent policy sets the real caps
		}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			hostileErr = err
			return
		}
		m := &hostileModules{rt: rt, hostile: hostile, notes: notes}
		var wg sync.WaitGroup
		var errH, errN error
		var infoH, infoN wasm.ModuleInfo
		wg.Go(func() { infoH, errH = rt.Validate(ctx, hostile) })
		wg.Go(func() { infoN, errN = rt.Validate(ctx, notes) })
		wg.Wait()
		if hostileErr = errors.Join(errH, errN); hostileErr == nil {
			m.hostileDig, m.notesDig = infoH.Digest, infoN.Digest
			hostileMods = m
		}
	})
	if hostileErr != nil {
		t.Fatalf("load the hostile and notes modules: %v", hostileErr)
	}
	return hostileMods
}

// turnRecord is one turn as the worker saw it: the error or result it
// returned, and when it started and ended.
type turnRecord struct {
	msg        string
	err        error
	res        *abi.TurnResult
	start, end time.Time
}

// recordingRunner records every turn's outcome by event message, so the
// suite can check the typed error the worker returned (the store keeps
// only its text).
type recordingRunner struct {
	host.Runner
	mu      sync.Mutex
	turns   []turnRecord
	started chan string
}

func (r *recordingRunner) Instantiate(ctx context.Context, binding string) (host.Instance, error) {
	inst, err := r.Runner.Instantiate(ctx, binding)
	if err != nil {
		return nil, err
	}
	return &recordingInstance{Instance: inst, r: r}, nil
}

// records returns the turns of message msg, in the order they ended.
func (r *recordingRunner) records(msg string) []turnRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []turnRecord
	for _, rec := range r.turns {
		if rec.msg == msg {
			out = append(out, rec)
		}
	}
	return out
}

type recordingInstance struct {
	host.Instance
	r *recordingRunner
}

func (i *recordingInstance) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	rec := turnRecord{msg: req.Event.Message, start: time.Now()}
	select {
	case i.r.started <- req.Event.Message:
	default:
	}
	rec.res, rec.err = i.Instance.Turn(ctx, req)
	rec.end = time.Now()
	i.r.mu.Lock()
	i.r.turns = append(i.r.turns, rec)
	i.r.mu.Unlock()
	return rec.res, rec.err
}

// ShouldRecycle passes the wasm instance's answer through.
func (i *recordingInstance) ShouldRecycle() bool {
	if rc, ok := i.Instance.(host.Recycler); ok {
		return rc.ShouldRecycle()
	}
	return false
}

func TestHostileModulesFailTheirAttemptsWhileOtherSessionsCommit(t *testing.T) {
	mods := loadHostile(t) // before the parallel subtests: one compile
	eachDriver(t, func(t *testing.T, st store.Store) {
		start := time.Now()
		ctx := context.Background()
		rec := &recordingRunner{Runner: runner.NewWasm(mods.rt, st), started: make(chan string, 64)}
		pol := testPolicy()
		pol.TurnTimeout = time.Minute // generous: a loaded machine is slow
		pol.MaxAttempts = 1           // one failed attempt dead-letters: the suite checks that attempt
		// The attacks saturate both cores for seconds: a short lease could
		// expire under them and cancel turns (correctly, but not what the
		// suite is about).
		pol.LeaseTTL = 30 * time.Second
		loopPol := pol.AgentPolicy
		loopPol.TurnTimeout = loopTurnTimeout
		pol.Agents = map[string]host.AgentPolicy{"hostile-loop": loopPol}
		h, err := host.New(host.Options{Store: st, Runner: rec, Policy: pol, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- h.Run(runCtx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("host.Run: %v", err)
			}
		})
		f := &fixture{t: t, st: st, h: h}
		agent := func(name, digest string, body []byte) store.Agent {
			if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: digest, ABIVersion: abi.Version, Bytes: body}); err != nil {
				t.Fatal(err)
			}
			a, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: name, ModuleDigest: digest, CrashPolicy: store.CrashRestart})
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
		hostile := agent("hostile", mods.hostileDig, mods.hostile)
		hostileLoop := agent("hostile-loop", mods.hostileDig, mods.hostile)
		notesKey := f.session(agent("notes", mods.notesDig, mods.notes))
		notesSent := 0
		note := func(text string) {
			f.signal(notesKey, "note "+text)
			notesSent++
		}
		notesCommitted := func() int64 { return f.get(notesKey).TurnCount }
		note("warm-up") // loads the notes instance before the attacks
		f.waitFor("the warm-up note", func() bool { return notesCommitted() == 1 })

		// What the file, socket and environment attacks must not get.
		secret := "paddock-secret-" + uuid.NewString()
		secretPath := filepath.Join(t.TempDir(), "secret.txt")
		if err := os.WriteFile(secretPath, []byte(secret), 0o644); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var conns atomic.Int32
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				conns.Add(1)
				c.Close()
			}
		}()
		t.Cleanup(func() { ln.Close() })
		_, hadTmpFile := os.Stat("/tmp/paddock-hostile")

		type attack struct {
			msg string
			// kind is the *wasm.TurnError kind the worker must return;
			// "" for an attack that answers an error outcome instead.
			kind string
			// want are substrings of the error ("re:" and a regexp: a
			// match); never, substrings it must not hold.
			want, never []string
		}
		attacks := []attack{
			{msg: "membomb", kind: wasm.KindOOM, want: []string{"out of memory", "cap 32 MiB", "cannot allocate 1073741824-byte block"}},
			{msg: "grow", kind: wasm.KindOOM, want: []string{"out of memory", "cap 32 MiB"}},
			{msg: "recurse", kind: wasm.KindOOM, want: []string{"out of memory", "runtime.stackalloc"}},
			// The controller sets the deadline just before the call: a
			// little less than the timeout is left when the turn starts.
			{msg: "loop", kind: wasm.KindTimeout, want: []string{`re:turn exceeded its deadline of (7\.\d+|8)s `, "module closed with context deadline exceeded"}},
			{msg: "huge", kind: wasm.KindOversized, want: []string{"result is 1048", fmt.Sprintf("limit %d", hostileResultBytes)}},
			{msg: "files " + secretPath, want: []string{
				"read " + secretPath + `: 0 bytes "", err=open ` + secretPath + ": Bad file number",
				`read /etc/passwd: 0 bytes ""`, `list /: 0 bytes ""`, "create /tmp/paddock-hostile: 0 bytes \"\", err=",
				"path_open(3, etc/passwd): errno 8", "fd_read(3): errno 8, 0 bytes",
			}, never: []string{secret, "root:"}},
			{msg: "socket " + ln.Addr().String(), want: []string{
				"dial " + ln.Addr().String() + ": ", "connect: Connection refused", "sock_accept(3): errno 8",
			}, never: []string{"CONNECTED"}},
			// Text no database column can hold (PostgreSQL text refuses NUL
			// and invalid UTF-8): the failure is still recorded, once.
			{msg: "nul", kind: wasm.KindInvalidResult, want: []string{"error contains a NUL character"}},
			{msg: "binary", kind: wasm.KindTrap, want: []string{"garbage", "hostile: crash after binary stderr"}},
			{msg: "env", want: []string{`environ=[] args=[] PATH="" HOME=""`}},
		}
		for _, v := range []string{"PATH", "HOME", "USER", "PWD"} {
			if val := os.Getenv(v); len(val) > 3 {
				attacks[len(attacks)-1].never = append(attacks[len(attacks)-1].never, val)
			}
		}

		// The loop first: while it spins, a notes turn must commit.
		keys := map[string]store.ActorKey{}
		keys["loop"] = f.session(hostileLoop)
		f.signal(keys["loop"], "loop")
		for m := recv(t, rec.started); m != "loop"; m = recv(t, rec.started) {
		}
		note("while the loop spins")
		f.waitFor("a note to commit while the loop spins", func() bool { return notesCommitted() == 2 })
		if recs := rec.records("loop"); len(recs) > 0 {
			t.Errorf("the loop's turn ended (%v) before a notes turn could commit next to it", recs[0].err)
		}
		// The rest at once, each in a session of its own, with notes
		// signals in between.
		for i, a := range attacks {
			if a.msg == "loop" {
				continue
			}
			keys[a.msg] = f.session(hostile)
			f.signal(keys[a.msg], a.msg)
			note(fmt.Sprintf("during attack %d", i))
		}
		for _, a := range attacks {
			t.Run(strings.Fields(a.msg)[0], func(t *testing.T) {
				key := keys[a.msg]
				f.waitFor(a.msg+" to be dead-lettered", func() bool { return f.get(key).DeadLetters == 1 })
				es := f.events(key)
				if len(es) != 1 || es[0].Status != store.EventDeadLetter || es[0].Attempts != 1 {
					t.Fatalf("events %+v, want one dead letter after one failed attempt", es)
				}
				chain, err := st.EventErrors(ctx, key, es[0].ID)
				if err != nil || len(chain) != 1 {
					t.Fatalf("error chain %+v, %v: want one entry", chain, err)
				}
				recs := rec.records(a.msg)
				if len(recs) != 1 {
					t.Fatalf("%d turns ran, want 1", len(recs))
				}
				r := recs[0]
				var text string
				if a.kind != "" {
					var te *wasm.TurnError
					if !errors.As(r.err, &te) || te.Kind != a.kind {
						t.Fatalf("worker returned %T %v (result %+v), want a *wasm.TurnError of kind %s", r.err, r.err, r.res, a.kind)
					}
					text = te.Error()
					if !strings.HasPrefix(es[0].LastError, a.kind+": ") {
						t.Errorf("last_error %q does not start with the kind %q", es[0].LastError, a.kind)
					}
				} else {
					if r.err != nil || r.res == nil || r.res.Outcome != abi.OutcomeError {
						t.Fatalf("worker returned %+v, %v; want an error outcome reporting the attempts", r.res, r.err)
					}
					text = r.res.Error
				}
				for _, s := range append([]string{text}, es[0].LastError, chain[0].Error) {
					for _, n := range a.never {
						if strings.Contains(s, n) {
							t.Errorf("the guest got %q of the host: %s", n, s)
						}
					}
				}
				for _, w := range a.want {
					if re, ok := strings.CutPrefix(w, "re:"); ok {
						if !regexp.MustCompile(re).MatchString(text) {
							t.Errorf("error does not match %s:\n%s", re, text)
						}
					} else if !strings.Contains(text, w) {
						t.Errorf("error does not say %q:\n%s", w, text)
					}
				}
				if a.msg == "binary" && !strings.Contains(es[0].LastError, "garbage \uFFFD") {
					t.Errorf("last_error %q does not keep the guest's stderr, made storable", es[0].LastError)
				}
				t.Logf("%s: %s", a.msg, firstLine(es[0].LastError))
			})
		}
		f.waitFor("every note to commit", func() bool { return notesCommitted() == int64(notesSent) })
		for _, e := range f.events(notesKey) {
			if e.Status != store.EventDone {
				t.Errorf("notes event %d ended %s next to the attacks: %s", e.ID, e.Status, e.LastError)
			}
		}
		if turns := f.transcript(notesKey); !strings.Contains(turns[len(turns)-1].Messages[1].Content, fmt.Sprint(notesSent)) {
			t.Errorf("last notes reply %q does not count %d notes", turns[len(turns)-1].Messages[1].Content, notesSent)
		}
		// Still nothing reached the host after the turns.
		time.Sleep(50 * time.Millisecond)
		if n := conns.Load(); n != 0 {
			t.Errorf("the socket attack reached the host's listener %d times", n)
		}
		if _, err := os.Stat("/tmp/paddock-hostile"); hadTmpFile != nil && err == nil {
			t.Error("the file attack created /tmp/paddock-hostile on the host")
		}
		t.Logf("hostile suite on %s: %s", st.Driver(), time.Since(start).Round(time.Millisecond))
	})
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
