package pluginhost

import (
	"errors"
	"fmt"
	"strings"
)

// Kinds of a TurnError.
const (
	// KindStart: no process could be started for the turn: the binary is
	// missing or not executable, the process exited before the go-plugin
	// handshake, or it did not complete the handshake within
	// Options.StartTimeout. The plugin did not accept the turn.
	KindStart = "start"
	// KindChecksum: the binary's sha256 no longer matches the registered
	// one (checked before every start). The plugin did not accept the turn.
	KindChecksum = "checksum"
	// KindVersion: the plugin speaks another ABI major version; the
	// message names both. The plugin did not accept the turn.
	KindVersion = "version"
	// KindProtocol: the plugin broke the protocol: something other than
	// the go-plugin handshake on stdout, a non-gRPC plugin, no turn
	// service, or malformed frames. Its process is replaced.
	KindProtocol = "protocol"
	// KindCrash: the plugin process exited or its connection broke during
	// the turn (e.g. kill -9, a panic in a goroutine, os.Exit).
	KindCrash = "crash"
	// KindUnresponsive: the process stopped answering health checks during
	// the turn and was killed.
	KindUnresponsive = "unresponsive"
	// KindTimeout: the turn ran past its deadline (the caller's or
	// Options.TurnTimeout).
	KindTimeout = "timeout"
	// KindCanceled: the caller cancelled the turn.
	KindCanceled = "canceled"
	// KindInvalidResult: the result is not valid v1 JSON, exceeds
	// Options.MaxResultBytes, fails abi.TurnResult.Validate, or echoes
	// neither the request's turn_ref nor that of a steer the plugin took in.
	KindInvalidResult = "invalid_result"
	// KindRestartLimit: the plugin's processes failed Options.MaxRestarts
	// times within Options.RestartWindow; no process is started for it
	// until its cool-down ends. The plugin did not accept the turn.
	KindRestartLimit = "restart_limit"
	// KindBusy: every process already runs Config.MaxTurnsPerProcess turns
	// and Config.Processes are running. The plugin did not accept the turn.
	KindBusy = "busy"
	// KindClosed: the Manager was closed, or the plugin unregistered,
	// before or during the turn.
	KindClosed = "closed"
)

// TurnError is a failed plugin turn or process start. Every failure of a
// plugin ends here; the host never crashes or hangs on a plugin's behalf.
// The attempt fails (docs/DESIGN.md "Failure, retry and crash policy"). Sent says
// whether the request reached a running plugin process: when it is false
// (a failed start, KindRestartLimit, KindBusy, KindClosed before sending,
// or the deadline passing while a process started) the plugin never saw
// the turn, and the host may retry without consuming an attempt. When it
// is true, count the attempt even if Accepted is false: a plugin that
// crashes on a request usually dies before its receipt leaves the
// process, and a poison event must still reach max_attempts.
type TurnError struct {
	// Kind is one of the Kind constants.
	Kind string
	// Op is what failed: "start" (a process start) or "turn".
	Op string
	// Plugin is the registered plugin (worker) name.
	Plugin string
	// SHA256 is the registered binary's checksum, lowercase hex.
	SHA256 string
	// PID is the plugin process, 0 when none was started.
	PID int
	// TurnRef is the request's turn_ref (abi.TurnRef.String), empty for
	// starts outside a turn (registration).
	TurnRef string
	// Sent reports whether the request was handed to a running plugin
	// process (the turn may have run).
	Sent bool
	// Accepted reports whether the plugin's receipt (the accepted frame)
	// arrived before the failure: the turn certainly ran.
	Accepted bool
	// Output is the tail of what the process wrote to stderr (at most
	// 2 KiB), e.g. a Go panic or the reason it refused to start.
	Output string
	// Err is the underlying error.
	Err error
}

// Error reads like `plugin notes (sha256 3f2a…) pid 4242 turn a/s@e3/ev7/r0/d9:
// crash: plugin process exited during the turn (signal: killed)`.
func (e *TurnError) Error() string {
	// The cause first (it is what a user reads in an event's last_error);
	// where it happened after. The turn_ref is in the logs and the event.
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v", e.Kind, e.Err)
	if out := strings.TrimSpace(e.Output); out != "" {
		b.WriteString("; stderr: " + lastLines(out, 6))
	}
	fmt.Fprintf(&b, " [plugin %s", e.Plugin)
	if e.SHA256 != "" {
		fmt.Fprintf(&b, " sha256 %s", short(e.SHA256))
	}
	if e.PID != 0 {
		fmt.Fprintf(&b, " pid %d", e.PID)
	}
	b.WriteString("]")
	return b.String()
}

// Unwrap returns the underlying error.
func (e *TurnError) Unwrap() error { return e.Err }

// short abbreviates a hex checksum for messages.
func short(sum string) string {
	if len(sum) > 12 {
		return sum[:12] + "…"
	}
	return sum
}

// lastLines keeps the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append([]string{"…"}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// ConfigError is a refused registration: Field names the Config field at
// fault ("name", "path", "sha256", "env", "processes",
// "max_turns_per_process"), Value the offending value, and Err why. A
// process that failed its verification start is reported on "path" with a
// *TurnError inside (errors.As finds it).
type ConfigError struct {
	Plugin string
	Field  string
	Value  string
	Err    error
}

func (e *ConfigError) Error() string {
	if e.Value != "" {
		return fmt.Sprintf("plugin %s: %s %q: %v", e.Plugin, e.Field, e.Value, e.Err)
	}
	return fmt.Sprintf("plugin %s: %s: %v", e.Plugin, e.Field, e.Err)
}

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }

// Sentinel errors, wrapped by the errors that report them.
var (
	// ErrUnknownPlugin: no plugin of that name is registered.
	ErrUnknownPlugin = errors.New("plugin not registered")
	// ErrBindingChanged: the plugin is registered with another sha256 than
	// the binding asks for (the binary was replaced since the binding was
	// recorded); the old binding cannot run.
	ErrBindingChanged = errors.New("plugin binary changed since the binding was recorded")
	// ErrClosed: the Manager is closed.
	ErrClosed = errors.New("plugin manager closed")
	// ErrRequestTooLarge: the encoded TurnRequest exceeds
	// abi.MaxRequestBytes. Nothing was sent.
	ErrRequestTooLarge = errors.New("plugin turn request too large")
	// ErrInstanceClosed: Turn on a closed Instance.
	ErrInstanceClosed = errors.New("plugin instance closed")
)

// TurnSent reports whether the turn reached the plugin (the host's
// controller counts an attempt only then: docs/DESIGN.md "What counts as an
// attempt").
func (e *TurnError) TurnSent() bool { return e.Sent }
