package store_test

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/paddock-dev/paddock/store"
)

type sqlStateErr string

func (e sqlStateErr) Error() string    { return "pg: " + string(e) }
func (e sqlStateErr) SQLState() string { return string(e) }

func TestMarkUnavailableClassifiesConnectionFailuresOnly(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("store/postgres: get agent: %w", refused), true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{sqlStateErr("57P01"), true}, {sqlStateErr("08006"), true}, {sqlStateErr("57P03"), true},
		{sqlStateErr("23505"), false}, {store.ErrNotFound, false}, {errors.New("boom"), false},
	} {
		got := store.MarkUnavailable(c.err)
		if errors.Is(got, store.ErrUnavailable) != c.want || !errors.Is(got, c.err) {
			t.Errorf("MarkUnavailable(%v) = %v: unavailable %v, want %v (and the error kept)", c.err, got, errors.Is(got, store.ErrUnavailable), c.want)
		}
	}
	if store.MarkUnavailable(nil) != nil {
		t.Error("MarkUnavailable(nil) != nil")
	}
}
