package postgres_test

import (
	"context"
	"testing"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/storetest"
)

// TestConformance runs the shared store suite, each case on a fresh
// database.
func TestConformance(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) store.Store { return newStore(t) })
}

// TestDeferredWithoutGroupCommit runs the deferred-dispatch cases with
// every request on its own path: the deferred read on the pool, the
// promotion and the deferred commit each their own transaction on the
// pipe (the group commit's batches cover them in TestConformance).
func TestDeferredWithoutGroupCommit(t *testing.T) {
	storetest.ExerciseDeferred(t, func(t *testing.T) store.Store {
		s, err := postgres.Open(context.Background(), pgtest.DSN(t), postgres.WithoutGroupCommit())
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
