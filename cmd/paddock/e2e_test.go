package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// These tests run the real `paddock` binary as a separate process, kill it
// with SIGKILL between and in the middle of turns, restart it, and check
// through the API and the CLI that no accepted signal is lost, none is
// committed twice, and the transcript order is intact — on both drivers.

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// paddockBin builds the paddock binary once per test binary.
func paddockBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "paddock-e2e-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "paddock")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// portsHanded records the ports freePort has handed out in this test
// process, so two tests never get the same one.
var portsHanded sync.Map

// freePort returns a 127.0.0.1 address a `paddock serve` started a few
// seconds later can bind. The port comes from below Linux's ephemeral range
// (ip_local_port_range starts at 32768): a port the kernel handed out with
// `Listen(":0")` goes back to the ephemeral pool once closed and can be taken
// as the local end of any outgoing connection (a worker dialing, an HTTP
// client) before the server binds it — a CI run failed on exactly that.
func freePort(t *testing.T) string {
	t.Helper()
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if _, taken := portsHanded.LoadOrStore(port, true); taken {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // another process has it
		}
		ln.Close()
		return addr
	}
	t.Fatal("freePort: no free port in 20000-31999")
	return ""
}

// server is one `paddock serve` process.
type server struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
	log  *bytes.Buffer
	mu   *sync.Mutex
	done chan struct{} // closed when the process has exited
}

type syncBuffer struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (s syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

var warmOnce sync.Once

// warmCache starts one host alone before any other, so that it compiles the
// example modules into the shared cache once; the hosts the tests start in
// parallel then load them from it.
func warmCache(t *testing.T) {
	warmOnce.Do(func() {
		addr := freePort(t)
		s := startServerCold(t, writeConfig(t, "sqlite", addr), addr)
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		<-s.done
	})
}

// startServer starts `paddock serve --config cfg` and waits for /healthz.
func startServer(t *testing.T, cfg, addr string) *server {
	t.Helper()
	warmCache(t)
	return startServerCold(t, cfg, addr)
}

func startServerCold(t *testing.T, cfg, addr string) *server {
	t.Helper()
	s := &server{t: t, addr: addr, log: &bytes.Buffer{}, mu: &sync.Mutex{}}
	s.cmd = exec.Command(paddockBin(t), "serve", "--config", cfg)
	s.cmd.Stderr = syncBuffer{s.mu, s.log}
	s.cmd.Stdout = syncBuffer{s.mu, s.log}
	s.cmd.Env = append(os.Environ(), "PADDOCK_LOG__LEVEL=info")
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			<-s.done
		}
		if t.Failed() {
			s.mu.Lock()
			t.Logf("paddock serve log:\n%s", s.log.String())
			s.mu.Unlock()
		}
	})
	// Generous: a cold start compiles the example modules, and CI runs
	// several packages' tests at once on 2 cores.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		select {
		case <-s.done:
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Fatalf("paddock serve exited before it became healthy:\n%s", s.log.String())
		default:
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		if time.Now().After(deadline) {
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Fatalf("paddock serve did not become healthy: %v\n%s", err, s.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill9 kills the server with SIGKILL: no shutdown code runs.
func (s *server) kill9() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		s.t.Fatal(err)
	}
	<-s.done
}

// cli runs a paddock client command against the server and returns stdout.
func (s *server) cli(args ...string) string {
	s.t.Helper()
	cmd := exec.Command(paddockBin(s.t), append([]string{"--server", "http://" + s.addr}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("paddock %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return strings.TrimSpace(out.String())
}

// api is a client of the server's API.
func (s *server) api() *apiclient.Client { return apiclient.New("http://" + s.addr) }

func (s *server) session(agent, sess string) apiclient.Session {
	s.t.Helper()
	x, err := s.api().GetSession(context.Background(), agent, sess)
	if err != nil {
		s.t.Fatal(err)
	}
	return x
}

func (s *server) transcript(agent, sess string) []store.Turn {
	s.t.Helper()
	page, err := s.api().Transcript(context.Background(), agent, sess, apiclient.TranscriptOptions{Limit: 1000})
	if err != nil {
		s.t.Fatal(err)
	}
	return page.Turns
}

func (s *server) events(agent, sess string) []apiclient.Event {
	s.t.Helper()
	evs, err := s.api().ListEvents(context.Background(), agent, sess, apiclient.ListEventsOptions{Limit: 1000})
	if err != nil {
		s.t.Fatal(err)
	}
	return evs
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// editConfig replaces the first old in the config file at path with new,
// failing the test when old is not there (the config it edits changed).
func editConfig(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(b), old, new, 1)
	if edited == string(b) {
		t.Fatalf("%s has no %q to edit", path, old)
	}
	if err := os.WriteFile(path, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeConfig writes a serve config for driver into a temp dir.
func writeConfig(t *testing.T, driver, addr string) string {
	t.Helper()
	notes, _ := wasmtest.BuildExample(t, wasmtest.Notes)
	faulty, _ := wasmtest.BuildExample(t, wasmtest.Faulty)
	dir := t.TempDir()
	storeCfg := "store:\n  driver: sqlite\n"
	if driver == "postgres" {
		storeCfg = fmt.Sprintf("store:\n  driver: postgres\n  dsn: %q\n", pgtest.DSN(t))
	}
	cfg := fmt.Sprintf(`listen: %s
data_dir: %s
wasm:
  cache_dir: %s
%sruntime:
  lease_ttl: 2s
  scan_interval: 200ms
policy:
  idle_timeout: 5s
  backoff_min: 100ms
  backoff_max: 500ms
  max_attempts: 5
agents:
  - name: notes
    module_file: %s
  - name: faulty
    module_file: %s
`, addr, filepath.Join(dir, "data"), e2eCacheDir(t), storeCfg, notes, faulty)
	p := filepath.Join(dir, "paddock.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestKillDashNineLosesNoSignalAndCommitsNothingTwice(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"sqlite", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			addr := freePort(t)
			cfg := writeConfig(t, driver, addr)
			srv := startServer(t, cfg, addr)

			// The README walkthrough, with the CLI: three signals, three turns
			// in order, the notes carried across them…
			notes := srv.cli("session", "create", "notes")
			srv.cli("signal", "send", "notes", notes, "note buy milk")
			srv.cli("signal", "send", "notes", notes, "note call mum")
			waitUntil(t, "two notes turns", 30*time.Second, func() bool { return len(srv.transcript("notes", notes)) == 2 })

			// …with a kill -9 between signals.
			srv.kill9()
			srv = startServer(t, cfg, addr)
			listed := srv.cli("signal", "send", "notes", notes, "list", "--wait")
			if !strings.Contains(listed, "assistant: 1. buy milk") || !strings.Contains(listed, "2. call mum") {
				t.Errorf("signal send list --wait printed %q, want the listed notes", listed)
			}
			waitUntil(t, "the third notes turn", 30*time.Second, func() bool { return len(srv.transcript("notes", notes)) == 3 })
			text := srv.cli("transcript", "notes", notes)
			for _, want := range []string{"note buy milk", "note call mum", "buy milk", "call mum"} {
				if !strings.Contains(text, want) {
					t.Errorf("transcript lacks %q:\n%s", want, text)
				}
			}
			last := srv.transcript("notes", notes)[2]
			reply := last.Messages[len(last.Messages)-1].Content
			if !strings.Contains(reply, "buy milk") || !strings.Contains(reply, "call mum") {
				t.Errorf("list after restart = %q: the state did not survive kill -9", reply)
			}

			// A kill -9 in the middle of a turn: the slow turn and the one
			// queued behind it are both committed exactly once, in order.
			f := srv.cli("session", "create", "faulty")
			srv.cli("signal", "send", "faulty", f, "sleep 1500")
			srv.cli("signal", "send", "faulty", f, "after", "--idempotency-key", "after-1")
			waitUntil(t, "the slow turn to start", 30*time.Second, func() bool { return srv.events("faulty", f)[0].Binding != "" })
			time.Sleep(200 * time.Millisecond) // well inside the 1.5 s turn
			srv.kill9()
			srv = startServer(t, cfg, addr)
			// The client retries its signal after the crash: the idempotency
			// key returns the first event.
			out := srv.cli("signal", "send", "faulty", f, "after", "--idempotency-key", "after-1")
			if !strings.Contains(out, "already accepted") {
				t.Errorf("re-sent signal: %q, want the first event back", out)
			}
			waitUntil(t, "both faulty turns after the restart", 60*time.Second, func() bool { return len(srv.transcript("faulty", f)) == 2 })
			turns := srv.transcript("faulty", f)
			evs := srv.events("faulty", f)
			if len(evs) != 2 {
				t.Fatalf("%d events, want 2", len(evs))
			}
			if turns[0].EventID != evs[0].ID || turns[1].EventID != evs[1].ID {
				t.Errorf("turns handle events %d, %d; want %d, %d in acceptance order", turns[0].EventID, turns[1].EventID, evs[0].ID, evs[1].ID)
			}
			for _, e := range evs {
				if e.Status != "done" {
					t.Errorf("event %d is %s, want done", e.ID, e.Status)
				}
			}
			if evs[0].Attempts != 1 {
				t.Errorf("the interrupted event counts %d failed attempts, want 1 (its lease expired mid-turn)", evs[0].Attempts)
			}
			if got := turns[0].Messages[len(turns[0].Messages)-1].Content; !strings.Contains(got, "slept") && !strings.Contains(got, "1500") {
				t.Logf("slow turn reply: %q", got)
			}
		})
	}
}

// e2eCacheDir is a wasm compilation cache shared by every host process the
// tests start, so that only the first one compiles the examples.
func e2eCacheDir(t *testing.T) string {
	dir := filepath.Join(os.TempDir(), "paddock-e2e-wasm-cache")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// children returns the pids whose parent is pid (from /proc).
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		var p int
		if _, err := fmt.Sscanf(e.Name(), "%d", &p); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces: cut after ")".
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		var state string
		var ppid int
		if _, err := fmt.Sscanf(rest, " %s %d", &state, &ppid); err == nil && ppid == pid && state != "Z" {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
	var state string
	_, _ = fmt.Sscanf(rest, " %s", &state)
	return state != "Z" && state != "X"
}

func TestKillDashNineOfTheHostLeavesNoPluginProcess(t *testing.T) {
	t.Parallel()
	plugin, sum := plugintest.Build(t, "./examples/notes/plugin")
	dir := t.TempDir()
	addr := freePort(t)
	cfg := filepath.Join(dir, "paddock.yaml")
	body := fmt.Sprintf(`listen: %s
data_dir: %s
plugins:
  - name: notes-plugin
    path: %s
    sha256: %s
    processes: 2
agents:
  - name: notes-plugin
    plugin: notes-plugin
`, addr, filepath.Join(dir, "data"), plugin, sum)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, cfg, addr)
	sess := srv.cli("session", "create", "notes-plugin")
	if out := srv.cli("signal", "send", "notes-plugin", sess, "note one", "--wait"); !strings.Contains(out, "noted (1)") {
		t.Fatalf("plugin turn: %q", out)
	}
	kids := children(srv.cmd.Process.Pid)
	if len(kids) == 0 {
		t.Fatal("no plugin process runs under the host")
	}
	srv.kill9()
	waitUntil(t, "the plugin processes to exit after the host's kill -9", 10*time.Second, func() bool {
		for _, p := range kids {
			if alive(p) {
				return false
			}
		}
		return true
	})
	// A restarted host starts fresh plugin processes and the session goes on.
	srv = startServer(t, cfg, addr)
	if out := srv.cli("signal", "send", "notes-plugin", sess, "list", "--wait"); !strings.Contains(out, "1. one") {
		t.Errorf("after the restart: %q", out)
	}
}

// cpuTicks returns the user+system CPU ticks of pid (from /proc).
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var u, s int64
	fmt.Sscan(f[11], &u) // utime is field 14 of stat, 12th after "(comm) "
	fmt.Sscan(f[12], &s)
	return u + s
}

// startWorker starts `paddock worker` for the host at fabricAddr.
func startWorker(t *testing.T, fabricAddr, id, keyFile string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(paddockBin(t), "worker", "--connect", "tcp://"+fabricAddr, "--id", id, "--key-file", keyFile,
		"--pool", "remote", "--capacity", "1", "--cache-dir", filepath.Join(t.TempDir(), id))
	var log syncBuffer = syncBuffer{&sync.Mutex{}, &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			log.mu.Lock()
			t.Logf("worker %s log:\n%s", id, log.buf.String())
			log.mu.Unlock()
		}
	})
	return cmd
}

func TestKillDashNineOfARemoteWorkerMidTurnRetriesOnAnotherWorker(t *testing.T) {
	t.Parallel()
	faulty, _ := wasmtest.BuildExample(t, wasmtest.Faulty)
	dir := t.TempDir()
	addr, fabricAddr := freePort(t), freePort(t)
	keys := map[string]string{}
	for _, id := range []string{"w1", "w2"} {
		k := filepath.Join(dir, id+".key")
		out, err := exec.Command(paddockBin(t), "worker", "keygen").Output()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(k, out, 0o600); err != nil {
			t.Fatal(err)
		}
		keys[id] = k
	}
	cfg := filepath.Join(dir, "paddock.yaml")
	body := fmt.Sprintf(`listen: %s
data_dir: %s
wasm:
  cache_dir: %s
pools:
  remote:
    capacity: 8
    remote: true
fabric:
  listen: tcp://%s
  heartbeat_interval: 500ms
  heartbeat_timeout: 2s
  workers:
    - id: w1
      key_file: %s
    - id: w2
      key_file: %s
policy:
  backoff_min: 100ms
  backoff_max: 500ms
  turn_timeout: 3m  # the 20 s busy wait plus a module compile on a loaded machine
agents:
  - name: faulty-remote
    module_file: %s
    policy:
      pool: remote
`, addr, filepath.Join(dir, "data"), e2eCacheDir(t), fabricAddr, keys["w1"], keys["w2"], faulty)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, cfg, addr)
	workers := map[string]*exec.Cmd{"w1": startWorker(t, fabricAddr, "w1", keys["w1"]), "w2": startWorker(t, fabricAddr, "w2", keys["w2"])}

	sess := srv.cli("session", "create", "faulty-remote")
	// A warm-up turn: both workers are admitted and one has the module.
	if out := srv.cli("signal", "send", "faulty-remote", sess, "hello", "--wait"); !strings.Contains(out, "ok: hello") {
		t.Fatalf("warm-up turn: %q", out)
	}
	srv.cli("signal", "send", "faulty-remote", sess, "sleep 20000")
	// The worker running the busy-waiting turn is the one burning CPU.
	var victim string
	waitUntil(t, "a worker to run the long turn", 2*time.Minute, func() bool {
		before := map[string]int64{}
		for id, w := range workers {
			before[id] = cpuTicks(w.Process.Pid)
		}
		time.Sleep(time.Second)
		// The busy one: ≥ 0.2 s of CPU in the second, and more than twice
		// the other's (a loaded machine may give it far less than a core).
		d1, d2 := cpuTicks(workers["w1"].Process.Pid)-before["w1"], cpuTicks(workers["w2"].Process.Pid)-before["w2"]
		switch {
		case d1 >= 20 && d1 > 2*d2:
			victim = "w1"
		case d2 >= 20 && d2 > 2*d1:
			victim = "w2"
		}
		return victim != ""
	})
	killed := time.Now()
	if err := workers[victim].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Within the heartbeat timeout (2 s) the attempt fails and the retry
	// runs on the other worker.
	waitUntil(t, "the attempt to fail", 30*time.Second, func() bool { return srv.events("faulty-remote", sess)[1].Attempts == 1 })
	failedAfter := time.Since(killed)
	figure(t, "fabric: kill -9 of the worker running a turn → attempt failed after %.1f s (heartbeat_timeout 2s)", failedAfter.Seconds())
	if failedAfter > 15*time.Second {
		t.Errorf("the lost worker's attempt failed after %v, want about the heartbeat timeout (2 s), far below the turn timeout", failedAfter)
	}
	survivor := "w1"
	if victim == "w1" {
		survivor = "w2"
	}
	// The survivor, idle until now but for heartbeats, spends a second of
	// CPU only on the retry (fetching and compiling the module if it lacks
	// it, then the busy wait). Counted in total, not per interval: on a
	// loaded machine a busy process may get far less than half a core.
	base := cpuTicks(workers[survivor].Process.Pid)
	waitUntil(t, "the retry on the other worker", 2*time.Minute, func() bool {
		time.Sleep(200 * time.Millisecond)
		return cpuTicks(workers[survivor].Process.Pid)-base >= 100
	})
	srv.cli("signal", "cancel", "faulty-remote", sess) // no need to wait 20 s more
	waitUntil(t, "the event to close", time.Minute, func() bool { return srv.events("faulty-remote", sess)[1].Status != "open" })
	turns := srv.transcript("faulty-remote", sess)
	if len(turns) != 2 {
		t.Errorf("transcript holds %d turns, want 2 (the warm-up, then the cancelled retry recorded once)", len(turns))
	}
}

// TestServeSaysWhenTheAPIIsOpen: a host without an auth_token logs, once it
// serves, that it refuses no request whatever bearer token comes (a wrong
// one is accepted too), and answers a wrong token as the anonymous admin;
// a host with one logs nothing of the kind and refuses it.
func TestServeSaysWhenTheAPIIsOpen(t *testing.T) {
	t.Parallel()
	const warning = "the API is open: no auth_token is set"
	for _, c := range []struct {
		name   string
		env    []string
		open   bool
		status int // of GET /v1/agents with a wrong bearer token
	}{{"open", nil, true, http.StatusOK}, {"token", []string{"PADDOCK_AUTH_TOKEN=e2e-open-token"}, false, http.StatusUnauthorized}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			addr := freePort(t)
			s := startServerEnv(t, writeConfig(t, "sqlite", addr), addr, c.env...)
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/agents", nil)
			req.Header.Set("Authorization", "Bearer not-a-token")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Errorf("GET /v1/agents with a wrong token: %d, want %d", resp.StatusCode, c.status)
			}
			// The warning comes before "paddock serving", which may follow
			// the first healthy answer by a moment.
			var logText string
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				s.mu.Lock()
				logText = s.log.String()
				s.mu.Unlock()
				if strings.Contains(logText, "paddock serving") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the host's log has no start line: %q", logText)
				}
			}
			if got := strings.Contains(logText, warning); got != c.open {
				t.Errorf("log contains %q: %v, want %v:\n%s", warning, got, c.open, logText)
			}
		})
	}
}
