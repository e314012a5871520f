package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/paddock-dev/paddock/store/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestDSNGivesFreshDatabase checks that each call yields an empty, distinct
// database the test can write to.
func TestDSNGivesFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := map[string]bool{}
	for range 2 {
		conn, err := pgx.Connect(ctx, pgtest.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		var db string
		var tables int
		if err := conn.QueryRow(ctx, `SELECT current_database(), (SELECT count(*) FROM pg_tables WHERE schemaname = 'public')`).Scan(&db, &tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Errorf("database %s has %d tables, want 0", db, tables)
		}
		if names[db] {
			t.Errorf("database %s handed out twice", db)
		}
		names[db] = true
		if _, err := conn.Exec(ctx, `CREATE TABLE t (id int)`); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
	}
}

// TestParallelDatabases creates databases from parallel tests at once.
func TestParallelDatabases(t *testing.T) {
	t.Parallel()
	for i := range 4 {
		t.Run("db", func(t *testing.T) {
			t.Parallel()
			_ = i
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, pgtest.DSN(t))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if err := conn.Ping(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
