package postgres_test

import (
	"testing"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/storetest"
)

// TestConformance runs the shared store suite, each case on a fresh
// database.
func TestConformance(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) store.Store { return newStore(t) })
}
