package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/host/api/client"
)

// proc is one incarnation of a child process (a host or a worker).
type proc struct {
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed once the process has exited and been reaped
	log  *os.File
}

// spawn starts name with args, its output appended to logPath. The child
// runs in its own process group (a terminal ^C reaches only this program,
// which tears the children down in order) and is SIGKILLed by the kernel if
// this program dies first (PR_SET_PDEATHSIG), so no child outlives a run.
func spawn(bin string, args []string, env []string, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), log: f}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL (and SIGCONT, in case it was stopped) and waits for
// the exit.
func (p *proc) kill() {
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	<-p.done
}

// terminate asks the process to stop (SIGTERM), and kills it after grace.
func (p *proc) terminate(grace time.Duration) {
	_ = syscall.Kill(p.pid, syscall.SIGCONT)
	_ = syscall.Kill(p.pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

// host is one `paddock serve` slot: its address, config, and the current
// incarnation.
type host struct {
	idx        int
	addr       string // API host:port
	fabricAddr string // host:port of the fabric ROUTER
	cfgPath    string
	logDir     string

	mu   sync.Mutex
	p    *proc
	inc  int  // incarnations started
	up   bool // healthy and not killed since
	busy bool // a fault (kill/restart, stall) holds this host
}

func (h *host) name() string { return fmt.Sprintf("host%d", h.idx) }

func (h *host) logPath(inc int) string {
	return filepath.Join(h.logDir, fmt.Sprintf("host%d.%d.log", h.idx, inc))
}

// isUp reports whether the host is believed to serve its API.
func (h *host) isUp() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.up
}

func (h *host) current() (*proc, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.p, h.inc
}

// start starts a new incarnation and waits until /healthz answers 200.
// A process that exits before (e.g. PostgreSQL is restarting and the
// store does not open) is started again, until timeout.
func (h *host) start(ctx context.Context, bin string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	probe := client.New("http://"+h.addr, client.WithHTTPClient(&http.Client{Timeout: 2 * time.Second}), client.WithUserAgent("paddock-chaos"))
	pause := 200 * time.Millisecond
	for {
		h.mu.Lock()
		h.inc++
		inc := h.inc
		h.mu.Unlock()
		p, err := spawn(bin, []string{"serve", "--config", h.cfgPath}, hostEnv(), h.logPath(inc))
		if err != nil {
			return fmt.Errorf("%s: start: %w", h.name(), err)
		}
		h.mu.Lock()
		h.p = p
		h.mu.Unlock()
		for {
			if p.exited() {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not become healthy in %v (log %s)", h.name(), timeout, h.logPath(inc))
			}
			if _, err := probe.Health(ctx); err == nil {
				h.mu.Lock()
				h.up = true
				h.mu.Unlock()
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s exited before it became healthy (log %s):\n%s", h.name(), h.logPath(inc), tail(h.logPath(inc), 2048))
		}
		// PostgreSQL restarting, most likely: again, less and less often.
		time.Sleep(pause)
		pause = min(2*pause, 3*time.Second)
	}
}

// hostEnv is this process's environment without PADDOCK_ variables (the
// config file is the whole configuration), with info logging.
func hostEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PADDOCK_") {
			env = append(env, kv)
		}
	}
	return env
}

// worker is one `paddock worker` slot, connected to one host's fabric.
type worker struct {
	id       string
	host     *host
	keyFile  string
	cacheDir string
	logDir   string

	mu   sync.Mutex
	p    *proc
	inc  int
	busy bool // a fault holds this worker (killed and not yet restarted, or stopped)
}

func (w *worker) start(bin string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inc++
	p, err := spawn(bin, []string{"worker", "--connect", "tcp://" + w.host.fabricAddr, "--id", w.id,
		"--key-file", w.keyFile, "--pool", "remote", "--capacity", "4", "--cache-dir", w.cacheDir},
		hostEnv(), filepath.Join(w.logDir, fmt.Sprintf("%s.%d.log", w.id, w.inc)))
	if err != nil {
		return fmt.Errorf("worker %s: start: %w", w.id, err)
	}
	w.p = p
	return nil
}

func (w *worker) current() *proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.p
}

// childrenNamed returns the live (not zombie) children of ppid whose
// command name is comm, from /proc.
func childrenNamed(ppid int, comm string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		c, state, pp, ok := procStat(pid)
		if ok && pp == ppid && c == comm && state != "Z" && state != "X" {
			out = append(out, pid)
		}
	}
	return out
}

// procStat reads the command name, state and parent pid of pid.
func procStat(pid int) (comm, state string, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", "", 0, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", "", 0, false
	}
	comm = s[open+1 : end]
	if _, err := fmt.Sscanf(s[end+1:], " %s %d", &state, &ppid); err != nil {
		return "", "", 0, false
	}
	return comm, state, ppid, true
}

// tail returns the last n bytes of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
