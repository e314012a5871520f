package store

import (
	"errors"
	"net"
	"syscall"
)

// ErrUnavailable: the store cannot be reached — the connection was
// refused, reset or closed, or the server is shutting down or starting.
// Drivers mark such failures with MarkUnavailable where they wrap their
// errors, so that callers test errors.Is(err, ErrUnavailable) and need not
// know a driver's error types.
var ErrUnavailable = errors.New("store unavailable")

// unavailableError marks a driver's error as ErrUnavailable and keeps it
// in the chain.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string        { return e.err.Error() }
func (e *unavailableError) Unwrap() error        { return e.err }
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }

// MarkUnavailable returns err marked as ErrUnavailable when it is a failure
// to reach the store (Unreachable), else err unchanged.
func MarkUnavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || !Unreachable(err) {
		return err
	}
	return &unavailableError{err}
}

// Unreachable classifies a driver error once for every driver: a network
// or socket failure (refused, reset, broken pipe, no socket file), or a
// SQLSTATE of class 08 (connection exception) or 57P01–57P03 (the server
// shuts down or does not accept connections yet). A query's own error
// (a constraint, a missing row, a deadline) is not.
func Unreachable(err error) bool {
	var ne *net.OpError
	if errors.As(err, &ne) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE, syscall.ECONNABORTED} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		switch code := coded.SQLState(); {
		case len(code) == 5 && code[:2] == "08", code == "57P01", code == "57P02", code == "57P03":
			return true
		}
	}
	return false
}
