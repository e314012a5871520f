package pluginhost_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/notes"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/plugins/plugintest"
)

// TestNotesRoundTrip runs a conversation through the notes plugin, carrying
// the state between turns as the host does, and checks it against the
// notes logic run in-process.
func TestNotesRoundTrip(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	path, sum := plugintest.Build(t, plugintest.Notes)
	start := time.Now()
	if err := m.Register(context.Background(), pluginhost.Config{Name: "notes", Path: path, SHA256: sum}); err != nil {
		t.Fatal(err)
	}
	figure(t, "plugin: register + verify start of the notes plugin process: %s", time.Since(start).Round(time.Millisecond))
	inst, err := m.Instance(context.Background(), "notes", sum)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := inst.Binding(), "plugin:notes@"+sum; got != want {
		t.Fatalf("binding %q, want %q", got, want)
	}
	var state, local []byte
	for i, msg := range []string{"note buy milk", "note call mum", "list", "remind 60 stretch", "count"} {
		req := request(msg, int64(i+1), state)
		res, err := inst.Turn(context.Background(), req)
		if err != nil {
			t.Fatalf("turn %q: %v", msg, err)
		}
		if res.TurnRef != req.TurnRef {
			t.Fatalf("turn_ref %v, want %v", res.TurnRef, req.TurnRef)
		}
		want := abi.Run(context.Background(), notes.Turn, request(msg, int64(i+1), local))
		gotJSON, _ := json.Marshal(res)
		wantJSON, _ := json.Marshal(want)
		if string(gotJSON) != string(wantJSON) {
			t.Fatalf("turn %q:\nplugin    %s\nin-process %s", msg, gotJSON, wantJSON)
		}
		state, local = res.State, want.State
	}
	s, err := notes.DecodeState(state)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Notes) != 2 || s.Turns != 5 || s.Reminders != 1 {
		t.Fatalf("state %+v", s)
	}

	// Round-trip latency of a small turn over gRPC.
	const n = 300
	lat := make([]time.Duration, n)
	for i := range lat {
		t0 := time.Now()
		if _, err := inst.Turn(context.Background(), request("count", 99, state)); err != nil {
			t.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	slices.Sort(lat)
	figure(t, "plugin: notes turn round trip over gRPC (%d turns, race=%v): p50 %s, p99 %s",
		n, raceEnabled, lat[n/2].Round(time.Microsecond), lat[n*99/100].Round(time.Microsecond))
}

// TestKillMidTurn: kill -9 of the plugin process mid-turn fails the turn
// with a crash; the next turn runs on a fresh process.
func TestKillMidTurn(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	pid1, _ := strconv.Atoi(reply(t, inst, "pid"))

	errc := make(chan error, 1)
	go func() {
		_, err := inst.Turn(context.Background(), request("sleep 20000", 2, nil))
		errc <- err
	}()
	if pid := waitTurns(t, m, "agent", 1); pid != pid1 {
		t.Fatalf("turn runs on pid %d, want %d", pid, pid1)
	}
	time.Sleep(50 * time.Millisecond) // let the plugin accept it
	if err := syscall.Kill(pid1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("turn did not fail after kill -9 of its process")
	}
	te := turnError(t, err, pluginhost.KindCrash)
	if !te.Accepted || te.PID != pid1 || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("accepted %v pid %d: %v", te.Accepted, te.PID, err)
	}
	if te.TurnRef == "" {
		t.Fatalf("no turn_ref in %v", err)
	}
	pid2, _ := strconv.Atoi(reply(t, inst, "pid"))
	if pid2 == pid1 || pid2 == 0 {
		t.Fatalf("next turn ran on pid %d, first process was %d", pid2, pid1)
	}
	st, _ := m.Status("agent")
	if st.Failures != 1 || len(st.Processes) != 1 || st.Processes[0].PID != pid2 {
		t.Fatalf("status %+v", st)
	}
}

// TestCrashInPlugin: a panic in a plugin goroutine kills the process; the
// error carries the panic from its stderr.
func TestCrashInPlugin(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	_, err := inst.Turn(context.Background(), request("crash", 1, nil))
	te := turnError(t, err, pluginhost.KindCrash)
	if !strings.Contains(te.Output, "crash requested") || !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("output %q: %v", te.Output, err)
	}
	if got := reply(t, inst, "echo again"); got != "echo: again" {
		t.Fatalf("reply %q", got)
	}
}

// TestRegistrationErrors covers bad registrations: each is refused with a
// clear error naming the field.
func TestRegistrationErrors(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{StartTimeout: 700 * time.Millisecond})
	agent, agentSum := plugintest.Build(t, agentPkg)
	_, notesSum := plugintest.Build(t, plugintest.Notes)
	dir := t.TempDir()
	noExec := filepath.Join(dir, "noexec")
	b, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(noExec, b, 0o644); err != nil {
		t.Fatal(err)
	}
	badPath, badSum := plugintest.Build(t, badVersionPkg)
	garbage, garbageSum := plugintest.Build(t, garbagePkg)
	silent, silentSum := plugintest.Build(t, silentPkg)

	cases := []struct {
		name  string
		cfg   pluginhost.Config
		field string
		kind  string   // of the *TurnError inside, if any
		want  []string // in the message
	}{
		{"bad name", pluginhost.Config{Name: "a b", Path: agent, SHA256: agentSum}, "name", "", []string{"letters"}},
		{"bad sum", pluginhost.Config{Name: "x", Path: agent, SHA256: "abc"}, "sha256", "", []string{"64 hex digits"}},
		{"wrong checksum", pluginhost.Config{Name: "x", Path: agent, SHA256: notesSum}, "sha256", "",
			[]string{notesSum, agentSum, "does not match"}},
		{"missing", pluginhost.Config{Name: "x", Path: filepath.Join(dir, "nope"), SHA256: agentSum}, "path", "",
			[]string{"does not exist"}},
		{"not executable", pluginhost.Config{Name: "x", Path: noExec, SHA256: agentSum}, "path", "",
			[]string{"not executable", "-rw-r--r--"}},
		{"directory", pluginhost.Config{Name: "x", Path: dir, SHA256: agentSum}, "path", "", []string{"not a regular file"}},
		{"reserved env", pluginhost.Config{Name: "x", Path: agent, SHA256: agentSum, Env: map[string]string{"PLUGIN_MIN_PORT": "1"}},
			"env", "", []string{"reserved"}},
		{"processes", pluginhost.Config{Name: "x", Path: agent, SHA256: agentSum, Processes: -1}, "processes", "", nil},
		{"abi version", pluginhost.Config{Name: "x", Path: badPath, SHA256: badSum}, "path", pluginhost.KindVersion,
			[]string{fmt.Sprintf("speaks ABI version %d", abi.Version+1), fmt.Sprintf("this host speaks ABI version %d", abi.Version)}},
		{"garbage on stdout", pluginhost.Config{Name: "x", Path: garbage, SHA256: garbageSum}, "path", pluginhost.KindProtocol,
			[]string{"hello from a plugin", "stdout"}},
		{"never answers", pluginhost.Config{Name: "x", Path: silent, SHA256: silentSum}, "path", pluginhost.KindStart,
			[]string{"within 700ms"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := m.Register(context.Background(), c.cfg)
			var ce *pluginhost.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T), want a *ConfigError", err, err)
			}
			if ce.Field != c.field {
				t.Fatalf("field %q, want %q: %v", ce.Field, c.field, err)
			}
			if c.kind != "" {
				te := turnError(t, err, c.kind)
				if te.PID != 0 {
					waitGone(t, te.PID, 5*time.Second)
				}
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error does not mention %q: %v", w, err)
				}
			}
			t.Log(err)
		})
	}
	if names := m.Names(); len(names) != 0 {
		t.Fatalf("registered %v after refusals", names)
	}
}

// TestAPluginWhoseChildHoldsItsStdoutIsRefusedAndReaped: a plugin that
// forks a child and never answers the handshake — the child holding its
// stdout, so the pipe never ends — is refused within the start timeout,
// and the child is killed with it (its process group): found in review, a
// registration hung for 11 minutes and the child outlived the host.
func TestAPluginWhoseChildHoldsItsStdoutIsRefusedAndReaped(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{StartTimeout: 700 * time.Millisecond, KillTimeout: time.Second})
	const marker = "987654"
	script := filepath.Join(t.TempDir(), "forks.sh")
	body := []byte("#!/bin/sh\nsleep " + marker + "\n")
	if err := os.WriteFile(script, body, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	done := make(chan error, 1)
	go func() {
		done <- m.Register(context.Background(), pluginhost.Config{Name: "forks", Path: script, SHA256: hex.EncodeToString(sum[:])})
	}()
	select {
	case err := <-done:
		turnError(t, err, pluginhost.KindStart)
	case <-time.After(time.Minute):
		t.Fatal("the registration has not returned after a minute")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids := sleeping(marker)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin's child still runs: pids %v", pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAPluginWhoseHandshakeNamesNoServerIsRefused: a handshake only names
// an address; a plugin whose address has no server is refused at
// registration (found in review: it was "registered and verified", and
// every turn then failed uncounted, for ever).
func TestAPluginWhoseHandshakeNamesNoServerIsRefused(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{StartTimeout: 5 * time.Second, KillTimeout: time.Second})
	script := filepath.Join(t.TempDir(), "nohost.sh")
	body := fmt.Appendf(nil, "#!/bin/sh\necho '1|%d|unix|%s|grpc|'\nsleep 987655\n", abi.Version, filepath.Join(t.TempDir(), "none.sock"))
	if err := os.WriteFile(script, body, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	err := m.Register(context.Background(), pluginhost.Config{Name: "nohost", Path: script, SHA256: hex.EncodeToString(sum[:])})
	turnError(t, err, pluginhost.KindProtocol)
	if !strings.Contains(err.Error(), "no gRPC server answers") {
		t.Errorf("refusal %v, want it to say no server answers", err)
	}
	if names := m.Names(); len(names) != 0 {
		t.Errorf("registered %v", names)
	}
}

// sleeping lists the pids of processes running "sleep arg".
func sleeping(arg string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(cmdline) == "sleep\x00"+arg+"\x00" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestChecksumVerifiedOnEveryStart: a binary replaced after registration
// is refused at its next start.
func TestChecksumVerifiedOnEveryStart(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	agent, sum := plugintest.Build(t, agentPkg)
	notesPath, _ := plugintest.Build(t, plugintest.Notes)
	path := filepath.Join(t.TempDir(), "agent")
	copyFile(t, agent, path)
	if err := m.Register(context.Background(), pluginhost.Config{Name: "agent", Path: path, SHA256: sum, SkipVerify: true}); err != nil {
		t.Fatal(err)
	}
	copyFile(t, notesPath, path)
	inst := instance(t, m, "agent")
	_, err := inst.Turn(context.Background(), request("echo hi", 1, nil))
	te := turnError(t, err, pluginhost.KindChecksum)
	if te.Sent || te.Accepted || !strings.Contains(err.Error(), "registered "+sum) {
		t.Fatalf("accepted %v: %v", te.Accepted, err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(to)
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestHangingTurn: a turn that ignores its deadline fails with a timeout
// at once, and its process, which does not stop it, is replaced.
func TestHangingTurn(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{CancelGrace: 200 * time.Millisecond})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	pid1, _ := strconv.Atoi(reply(t, inst, "pid"))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := inst.Turn(ctx, request("hang", 2, nil))
	te := turnError(t, err, pluginhost.KindTimeout)
	if d := time.Since(t0); d > 10*time.Second || !te.Accepted { // a hung turn never returns by itself
		t.Fatalf("returned after %s, accepted %v: %v", d, te.Accepted, err)
	}
	waitGone(t, pid1, 5*time.Second)
	pid2, _ := strconv.Atoi(reply(t, inst, "pid"))
	if pid2 == pid1 {
		t.Fatal("the hung process still serves turns")
	}
	if st, _ := m.Status("agent"); st.Failures != 1 || !strings.Contains(st.LastFailure, "did not stop") {
		t.Fatalf("status %+v", st)
	}
}

// TestCancel: a cancelled turn fails with KindCanceled; a plugin that
// honours cancellation keeps its process.
func TestCancel(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{CancelGrace: time.Second})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	pid1, _ := strconv.Atoi(reply(t, inst, "pid"))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := inst.Turn(ctx, request("sleep 20000", 2, nil))
		errc <- err
	}()
	waitTurns(t, m, "agent", 1)
	time.Sleep(50 * time.Millisecond)
	cancel()
	var err error
	select {
	case err = <-errc:
	case <-time.After(2 * time.Second):
		t.Fatal("cancel did not end the turn")
	}
	te := turnError(t, err, pluginhost.KindCanceled)
	if !te.Accepted {
		t.Fatalf("not accepted: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // past CancelGrace
	if pid2, _ := strconv.Atoi(reply(t, inst, "pid")); pid2 != pid1 {
		t.Fatalf("process replaced (%d → %d) though the plugin stopped the turn", pid1, pid2)
	}
	if st, _ := m.Status("agent"); st.Failures != 0 {
		t.Fatalf("status %+v", st)
	}
}

// TestSteer: a steer sent mid-turn reaches the plugin's PollSteer, and the
// result echoes the steer's turn_ref; a turn that does not poll echoes the
// request's.
func TestSteer(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")

	req := request("think 60000", 7, nil)
	steer := abi.Steer{TurnRef: req.TurnRef, EventID: 8, Message: "make it oat milk"}
	steer.TurnRef.Revision, steer.TurnRef.DeliveryID = 1, "d7b"
	ch := make(chan abi.Steer, 1)
	go func() {
		waitTurns(t, m, "agent", 1)
		time.Sleep(50 * time.Millisecond)
		ch <- steer
	}()
	t0 := time.Now()
	res, err := inst.Turn(abi.WithSteers(context.Background(), ch), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Messages[0].Content != "steered: make it oat milk" || res.TurnRef != steer.TurnRef {
		t.Fatalf("reply %q ref %v", res.Messages[0].Content, res.TurnRef)
	}
	if d := time.Since(t0); d > 20*time.Second { // far below the 60 s think
		t.Fatalf("steered turn took %s", d)
	}

	// Not polled: the steer stays unseen and the request's ref is echoed.
	ch2 := make(chan abi.Steer, 1)
	ch2 <- steer
	req2 := request("sleep 100", 9, nil)
	res, err = inst.Turn(abi.WithSteers(context.Background(), ch2), req2)
	if err != nil {
		t.Fatal(err)
	}
	if res.TurnRef != req2.TurnRef {
		t.Fatalf("ref %v, want the request's %v", res.TurnRef, req2.TurnRef)
	}
}

// TestRestartIntensity: past MaxRestarts failures in the window, no
// process is started until the cool-down ends.
func TestRestartIntensity(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{MaxRestarts: 2, RestartWindow: time.Minute, RestartCooldown: time.Second})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	for i := range 3 {
		_, err := inst.Turn(context.Background(), request("exit", int64(i), nil))
		if te := turnError(t, err, pluginhost.KindCrash); !te.Sent {
			t.Fatalf("a crash on the request is not counted as sent: %v", err)
		}
	}
	_, err := inst.Turn(context.Background(), request("echo hi", 9, nil))
	te := turnError(t, err, pluginhost.KindRestartLimit)
	if te.Sent || te.Accepted || !strings.Contains(err.Error(), "more than 2 process failures within 1m0s") ||
		!strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("accepted %v: %v", te.Accepted, err)
	}
	st, _ := m.Status("agent")
	if st.CoolingUntil.IsZero() || slices.ContainsFunc(st.Processes, func(p pluginhost.ProcessStatus) bool { return !p.Retired }) {
		t.Fatalf("status %+v", st)
	}
	time.Sleep(1100 * time.Millisecond)
	if got := reply(t, inst, "echo back"); got != "echo: back" {
		t.Fatalf("reply %q", got)
	}
}

// TestEnvironment: the plugin sees only its registered environment.
func TestEnvironment(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{Env: map[string]string{"GREETING": "hello"}})
	inst := instance(t, m, "agent")
	if got := reply(t, inst, "env GREETING"); got != "GREETING=hello" {
		t.Fatalf("reply %q", got)
	}
	if os.Getenv("PATH") == "" {
		t.Skip("host has no PATH")
	}
	if got := reply(t, inst, "env PATH"); got != "PATH unset" {
		t.Fatalf("the plugin inherited the host's environment: %q", got)
	}
}

// TestProcesses: concurrent turns spread over Config.Processes processes.
func TestProcesses(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{Processes: 2})
	inst := instance(t, m, "agent")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			// Long enough that all four overlap even when the second
			// process starts slowly on a loaded machine (0.4–0.6 s seen).
			_, err := inst.Turn(context.Background(), request("sleep 4000", int64(i), nil))
			errs <- err
		})
	}
	waitTurns(t, m, "agent", 4)
	st, _ := m.Status("agent")
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(st.Processes) != 2 || st.Processes[0].Turns != 2 || st.Processes[1].Turns != 2 {
		t.Fatalf("processes %+v, want 2 with 2 turns each", st.Processes)
	}
}

// TestUnresponsive: a process that stops answering (SIGSTOP) mid-turn is
// killed and the turn fails with KindUnresponsive.
func TestUnresponsive(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{HealthInterval: 100 * time.Millisecond, HealthTimeout: 200 * time.Millisecond})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	errc := make(chan error, 1)
	go func() {
		_, err := inst.Turn(context.Background(), request("sleep 20000", 1, nil))
		errc <- err
	}()
	pid := waitTurns(t, m, "agent", 1)
	time.Sleep(50 * time.Millisecond)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-errc:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatal("turn on a stopped process did not fail")
	}
	turnError(t, err, pluginhost.KindUnresponsive)
	waitGone(t, pid, 5*time.Second)
	if got := reply(t, inst, "echo up"); got != "echo: up" {
		t.Fatalf("reply %q", got)
	}
}

// TestLogs: plugin log lines reach the host log tagged with the worker and
// the turn_ref; failed turns are logged with their turn_ref.
func TestLogs(t *testing.T) {
	t.Parallel()
	m, buf := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	req := request("log hello-there", 5, nil)
	if _, err := inst.Turn(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	ref := req.TurnRef.String()
	deadline := time.Now().Add(5 * time.Second)
	for {
		log := buf.String()
		if hasLine(log, "agent log", "worker=agent", "turn_ref="+ref, "text=hello-there") &&
			hasLine(log, "agent stderr: hello-there", "worker=agent", "stream=stderr") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin log lines missing:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err := inst.Turn(context.Background(), request("big", 6, nil))
	turnError(t, err, pluginhost.KindInvalidResult)
	if !hasLine(buf.String(), "plugin turn failed", "worker=agent", "turn_ref="+request("", 6, nil).TurnRef.String(), "kind=invalid_result") {
		t.Fatalf("failed turn not logged with its turn_ref:\n%s", buf.String())
	}
}

func hasLine(log string, parts ...string) bool {
	for line := range strings.SplitSeq(log, "\n") {
		ok := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestBindings: instances are bound to a name and a checksum.
func TestBindings(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	_, sum := register(t, m, "agent", agentPkg, pluginhost.Config{SkipVerify: true})
	if _, err := m.Instance(context.Background(), "nope", ""); !errors.Is(err, pluginhost.ErrUnknownPlugin) {
		t.Fatalf("unknown plugin: %v", err)
	}
	other := strings.Repeat("ab", 32)
	if _, err := m.Instance(context.Background(), "agent", other); !errors.Is(err, pluginhost.ErrBindingChanged) {
		t.Fatalf("other checksum: %v", err)
	}
	b := pluginhost.Binding("agent", sum)
	name, s, ok := pluginhost.ParseBinding(b)
	if !ok || name != "agent" || s != sum {
		t.Fatalf("ParseBinding(%q) = %q %q %v", b, name, s, ok)
	}
	if _, _, ok := pluginhost.ParseBinding("sha256:" + sum); ok {
		t.Fatal("a module digest parsed as a plugin binding")
	}
	// Same config again: a no-op.
	path, _ := plugintest.Build(t, agentPkg)
	if err := m.Register(context.Background(), pluginhost.Config{Name: "agent", Path: path, SHA256: sum, SkipVerify: true}); err != nil {
		t.Fatal(err)
	}
	if err := m.Unregister(context.Background(), "agent"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Instance(context.Background(), "agent", sum); !errors.Is(err, pluginhost.ErrUnknownPlugin) {
		t.Fatalf("after unregister: %v", err)
	}
}

// TestClose: Close fails running turns and kills every process.
func TestClose(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{Processes: 2})
	inst := instance(t, m, "agent")
	errc := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := inst.Turn(context.Background(), request("hang", int64(i), nil))
			errc <- err
		}()
	}
	waitTurns(t, m, "agent", 2)
	st, _ := m.Status("agent")
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		turnError(t, <-errc, pluginhost.KindClosed)
	}
	for _, p := range st.Processes {
		waitGone(t, p.PID, 5*time.Second)
	}
	if _, err := inst.Turn(context.Background(), request("echo", 3, nil)); !errors.Is(err, pluginhost.ErrClosed) {
		t.Fatalf("turn after close: %v", err)
	}
}

const (
	helperEnv       = "PADDOCK_PLUGINS_TEST_HELPER"
	helperPathEnv   = "PADDOCK_PLUGINS_TEST_PATH"
	helperSumEnv    = "PADDOCK_PLUGINS_TEST_SHA256"
	helperNoSigEnv  = "PADDOCK_PLUGINS_TEST_NO_PDEATHSIG"
	helperPIDPrefix = "PLUGIN_PID "
)

// helperHost is the host process of TestNoOrphans: it registers the notes
// plugin, prints the plugin's pid and waits to be killed.
func helperHost() {
	m := pluginhost.NewManager(nil, pluginhost.Options{DisableParentDeathSignal: os.Getenv(helperNoSigEnv) != ""})
	err := m.Register(context.Background(), pluginhost.Config{Name: "notes",
		Path: os.Getenv(helperPathEnv), SHA256: os.Getenv(helperSumEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	st, err := m.Status("notes")
	if err != nil || len(st.Processes) != 1 {
		fmt.Fprintln(os.Stderr, "no plugin process", err)
		os.Exit(1)
	}
	fmt.Printf("%s%d\n", helperPIDPrefix, st.Processes[0].PID)
	time.Sleep(time.Hour)
}

// TestNoOrphans: after kill -9 of a host, its plugin processes exit — by
// the parent-death signal, and by the SDK's parent watch alone.
func TestNoOrphans(t *testing.T) {
	t.Parallel()
	path, sum := plugintest.Build(t, plugintest.Notes)
	for _, noSig := range []bool{false, true} {
		t.Run(fmt.Sprintf("pdeathsig=%v", !noSig), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=1", helperPathEnv+"="+path, helperSumEnv+"="+sum)
			if noSig {
				cmd.Env = append(cmd.Env, helperNoSigEnv+"=1")
			}
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				t.Fatalf("helper host: %v", err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, helperPIDPrefix)))
			if err != nil || processGone(pid) {
				t.Fatalf("helper host printed %q", line)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			t0 := time.Now()
			waitGone(t, pid, 5*time.Second)
			figure(t, "plugin: orphaned plugin process gone %s after kill -9 of its host (pdeathsig=%v)",
				time.Since(t0).Round(time.Millisecond), !noSig)
		})
	}
}
