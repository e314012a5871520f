package worker

import "fmt"

// ConfigError is a refused Config: Field names the field, Err why.
type ConfigError struct {
	Field string
	Err   error
}

// Error reads like "fabric: config key: is 16 bytes, want 32".
func (e *ConfigError) Error() string { return fmt.Sprintf("fabric: config %s: %v", e.Field, e.Err) }

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }

// RejectError is a REJECT that retrying cannot fix (another wire or ABI
// version, a HELLO the host refuses): Run returns it.
type RejectError struct {
	// Code and Message are the REJECT's (abi/FABRIC.md, "REJECT codes").
	Code, Message string
}

// Error reads like "fabric: the host rejected this worker: CODE: MESSAGE".
func (e *RejectError) Error() string {
	return fmt.Sprintf("fabric: the host rejected this worker: %s: %s", e.Code, e.Message)
}

// truncate cuts s to n bytes for a log line.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
