package wasm

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"

	"github.com/tetratelabs/wazero/api"
)

// Guest output limits.
const (
	// maxLogLine bounds one logged line or log-import message, in bytes;
	// longer ones are cut.
	maxLogLine = 4 << 10
	// stderrHeadBytes is how much of the turn's stderr a TurnError carries:
	// the beginning, where runtimes print the panic or fatal error.
	stderrHeadBytes = 1 << 10
)

// logLevelTurnError is the level of the runtime's own "wasm turn failed"
// record: debug, because the host logs every failed attempt once, with the
// error (which carries the head of the guest's stderr), at warn.
const logLevelTurnError = slog.LevelDebug

// logAttrs tags a record with the module digest and the turn_ref.
func logAttrs(digest, turnRef string, kv ...string) []slog.Attr {
	attrs := []slog.Attr{slog.String("module", digest)}
	if turnRef != "" {
		attrs = append(attrs, slog.String("turn_ref", turnRef))
	}
	for i := 0; i+1 < len(kv); i += 2 {
		attrs = append(attrs, slog.String(kv[i], kv[i+1]))
	}
	return attrs
}

// guestLog carries one instance's output to the host log: stdout and stderr
// line by line, and records of the paddock.log import, each tagged with the
// module digest and the current turn_ref, within a per-turn byte budget.
type guestLog struct {
	log    *slog.Logger
	digest string
	budget int // bytes per turn

	mu      sync.Mutex
	turnRef string
	left    int // budget left in this turn
	dropped int // bytes dropped in this turn
	partial [2]bytes.Buffer
	head    []byte // first stderrHeadBytes of stderr in this turn
	oom     bool   // a stderr line of this turn reported running out of memory
}

func newGuestLog(log *slog.Logger, digest string, budget int) *guestLog {
	return &guestLog{log: log, digest: digest, budget: budget}
}

// guestLogKey is the context key under which guest calls find their
// instance's guestLog (host functions are shared by all instances).
type guestLogKey struct{}

func withGuestLog(ctx context.Context, g *guestLog) context.Context {
	return context.WithValue(ctx, guestLogKey{}, g)
}

// startTurn resets the budget and tags what follows with turnRef.
func (g *guestLog) startTurn(turnRef string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.turnRef, g.left, g.dropped, g.head, g.oom = turnRef, g.budget, 0, g.head[:0], false
}

// retag tags what follows with turnRef, e.g. the ref of a steer the guest
// took in, keeping the turn's budget.
func (g *guestLog) retag(turnRef string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.turnRef = turnRef
}

// endTurn flushes partial lines and reports dropped output.
func (g *guestLog) endTurn(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	for fd := range g.partial {
		if g.partial[fd].Len() > 0 {
			g.emitLocked(ctx, streamLevel(fd), g.partial[fd].String(), streamName(fd))
			g.partial[fd].Reset()
		}
	}
	if g.dropped > 0 {
		g.log.LogAttrs(ctx, slog.LevelWarn, "wasm guest output over budget dropped",
			append(logAttrs(g.digest, g.turnRef), slog.Int("dropped_bytes", g.dropped), slog.Int("budget_bytes", g.budget))...)
	}
}

// stderrHead returns the first stderr bytes of this turn as text.
func (g *guestLog) stderrHead() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return string(bytes.TrimSpace(g.head))
}

// outOfMemory reports whether the guest said on stderr, in this turn, that
// it ran out of memory.
func (g *guestLog) outOfMemory() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.oom
}

// oomLine recognises the guest runtimes' last words when an allocation fails
// because memory.grow refused to pass the cap: Go ("fatal error: out of
// memory"), Rust ("memory allocation of N bytes failed"), C and others.
func oomLine(line []byte) bool {
	l := bytes.ToLower(line)
	return bytes.Contains(l, []byte("out of memory")) || bytes.Contains(l, []byte("memory allocation of"))
}

func streamName(fd int) string {
	if fd == 0 {
		return "stdout"
	}
	return "stderr"
}

// streamLevel is the level of guest stdout/stderr lines: debug, because a
// crashing Go guest prints hundreds of lines of goroutine dump (the head of
// stderr travels in the TurnError instead). Agents that want their lines
// seen at info or above use the log import (guest.Log).
func streamLevel(int) slog.Level { return slog.LevelDebug }

// emitLocked logs msg if the budget allows, else counts it as dropped.
func (g *guestLog) emitLocked(ctx context.Context, level slog.Level, msg, source string) {
	if len(msg) > maxLogLine {
		msg = msg[:maxLogLine] + "…(truncated)"
	}
	if len(msg) > g.left {
		g.dropped += len(msg)
		return
	}
	g.left -= len(msg)
	g.log.LogAttrs(ctx, level, msg, append(logAttrs(g.digest, g.turnRef), slog.String("source", source))...)
}

// write splits stream output fd (0 stdout, 1 stderr) into lines.
func (g *guestLog) write(fd int, p []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if fd == 1 && len(g.head) < stderrHeadBytes {
		g.head = append(g.head, p[:min(len(p), stderrHeadBytes-len(g.head))]...)
	}
	buf := &g.partial[fd]
	for len(p) > 0 {
		// Only the rest of the current line's room is searched: a search
		// of all of p for each line cut from a long one made a write
		// without newlines quadratic (found in review: one 48 MiB write
		// took 8.5 s of a core).
		room := maxLogLine - buf.Len()
		nl := bytes.IndexByte(p[:min(len(p), room+1)], '\n')
		if nl < 0 {
			if len(p) < room {
				buf.Write(p)
				return
			}
			buf.Write(p[:room])
			p = p[room:]
		} else {
			buf.Write(p[:nl])
			p = p[nl+1:]
		}
		if fd == 1 && oomLine(buf.Bytes()) {
			g.oom = true
		}
		g.emitLocked(context.Background(), streamLevel(fd), buf.String(), streamName(fd))
		buf.Reset()
	}
}

// streamWriter is the io.Writer given to wazero for one stream.
type streamWriter struct {
	g  *guestLog
	fd int
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.g.write(w.fd, p)
	return len(p), nil
}

func (g *guestLog) stdout() io.Writer { return streamWriter{g, 0} }
func (g *guestLog) stderr() io.Writer { return streamWriter{g, 1} }

// hostLog is the host function paddock.log(level i32, ptr i32, len i32):
// it logs the guest's UTF-8 message at the slog level. A message outside
// guest memory is ignored; calls outside a turn or instantiation (no
// guestLog in ctx) are ignored.
func hostLog(ctx context.Context, m api.Module, stack []uint64) {
	g, _ := ctx.Value(guestLogKey{}).(*guestLog)
	if g == nil {
		return
	}
	level := slog.Level(api.DecodeI32(stack[0]))
	ptr, n := api.DecodeU32(stack[1]), api.DecodeU32(stack[2])
	n = min(n, maxLogLine+1) // emitLocked cuts and marks longer ones
	msg, ok := m.Memory().Read(ptr, n)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.emitLocked(ctx, level, string(msg), "log")
}
