package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/store/storetest"
)

// open opens a fresh database file in t's temp dir and closes it at cleanup.
func open(t testing.TB) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "paddock.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) store.Store { return open(t) })
}

func TestOpenTwiceMigratesOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db with spaces?and#marks.db")
	for range 2 {
		s, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatalf("sqlite.Open: %v", err)
		}
		if got := s.Driver(); got != "sqlite" {
			t.Fatalf("Driver() = %q", got)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
}

func TestOpenFileURI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uri.db")
	s, err := sqlite.Open(t.Context(), "file:"+path+"?_txlock=deferred&_pragma=cache_size(-4000)")
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer s.Close()
	if _, err := s.ListModules(t.Context(), store.DefaultNamespace); err != nil {
		t.Fatalf("ListModules: %v", err)
	}
}

func TestOpenRefusesMemory(t *testing.T) {
	_, err := sqlite.Open(t.Context(), ":memory:")
	if err == nil || !strings.HasPrefix(err.Error(), "store/sqlite: open: ") {
		t.Fatalf("Open(:memory:) error = %v, want a store/sqlite: open: error", err)
	}
}

// A database file serves one Store at a time: a second Open is refused,
// naming the file and the holder, and the file opens again once the first
// Store closes.
func TestOpenRefusesAFileAnotherStoreHolds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "paddock.db")
	first, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	second, err := sqlite.Open(t.Context(), "file:"+path+"?_pragma=cache_size(-4000)")
	if err == nil {
		_ = second.Close()
		_ = first.Close()
		t.Fatal("a second Open of a held file succeeded")
	}
	if !errors.Is(err, sqlite.ErrInUse) || !strings.Contains(err.Error(), path) ||
		!strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second Open: %v; want ErrInUse naming %s and pid %d", err, path, os.Getpid())
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	again, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
