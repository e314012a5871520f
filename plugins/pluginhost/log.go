package pluginhost

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// slogLevel maps an hclog level to slog's: trace is below debug.
func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// hclogAdapter is an hclog.Logger that writes to a *slog.Logger. go-plugin
// logs through it: its own client lines, and every hclog JSON line a
// plugin writes to stderr, re-emitted at the plugin's level with the
// plugin's key/value pairs (a turn_ref among them when the plugin logged
// through plugins.Logger).
type hclogAdapter struct {
	log     *slog.Logger
	name    string
	implied []any
}

// newHclog returns an hclog.Logger writing to log.
func newHclog(log *slog.Logger) hclog.Logger { return &hclogAdapter{log: log} }

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	lvl := slogLevel(level)
	if !a.log.Enabled(context.Background(), lvl) {
		return
	}
	all := make([]any, 0, len(a.implied)+len(args)+2)
	if a.name != "" {
		all = append(all, "logger", a.name)
	}
	all = append(all, a.implied...)
	all = append(all, args...)
	if len(all)%2 == 1 { // hclog tolerates a dangling value; slog would print !BADKEY
		all = append(all[:len(all)-1], "extra", all[len(all)-1])
	}
	a.log.Log(context.Background(), lvl, msg, all...)
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(l hclog.Level) bool {
	return a.log.Enabled(context.Background(), slogLevel(l))
}

func (a *hclogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	c := *a
	c.implied = append(append([]any(nil), a.implied...), args...)
	return &c
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	c := *a
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *a
	c.name = name
	return &c
}

// SetLevel does nothing: the slog handler decides what is logged.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

// GetLevel reports the lowest level the slog handler takes (go-plugin skips
// plugin lines below it without parsing them).
func (a *hclogAdapter) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if a.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

func (a *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	level := hclog.Info
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		level = opts.ForceLevel
	}
	return &lineWriter{emit: func(line string) { a.Log(level, line) }}
}

// lineWriter calls emit once per complete line written to it (without the
// newline); a line longer than maxLine is emitted in pieces. Flush emits a
// trailing partial line.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(line string)
}

const maxLine = 16 << 10

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			if len(w.buf) >= maxLine {
				w.emit(string(w.buf[:maxLine]))
				w.buf = append(w.buf[:0], w.buf[maxLine:]...)
				continue
			}
			return len(p), nil
		}
		w.emit(strings.TrimRight(string(w.buf[:i]), "\r"))
		w.buf = append(w.buf[:0], w.buf[i+1:]...)
	}
}

// tail keeps the last size bytes written to it: a process's raw stderr,
// for TurnError.Output.
type tail struct {
	mu   sync.Mutex
	size int
	buf  []byte
}

func newTail(size int) *tail { return &tail{size: size} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.size; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// String returns the kept bytes, starting at a line boundary when the
// buffer was cut.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := string(t.buf)
	if len(t.buf) >= t.size {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return strings.TrimSpace(s)
}
