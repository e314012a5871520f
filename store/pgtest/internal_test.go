package pgtest

import (
	"os"
	"strings"
	"testing"
)

// TestNoServerFailsWithInstructions checks the message a machine without
// PostgreSQL gets: what was searched, how to install, how to use
// DATABASE_URL instead.
func TestNoServerFailsWithInstructions(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := searchBinDir("pg_config-missing", t.TempDir()+"/*/bin")
	if err == nil {
		t.Fatal("searchBinDir found server binaries in an empty search path")
	}
	for _, want := range []string{"no PostgreSQL server binaries", "apt-get install postgresql", "DATABASE_URL="} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestWithDatabase checks both DSN forms.
func TestWithDatabase(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u:p@h:5432/postgres?sslmode=disable", "postgres://u:p@h:5432/db1?sslmode=disable"},
		{"postgresql://h/", "postgresql://h/db1"},
		{"host=h user=u dbname=postgres", "host=h user=u dbname=postgres dbname=db1"},
	} {
		if got := withDatabase(c.in, "db1"); got != c.want {
			t.Errorf("withDatabase(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestDBNameIsValid checks that generated names are short, lower case and
// distinct.
func TestDBNameIsValid(t *testing.T) {
	long := strings.Repeat("TestSomething/With Spaces-And/Ümlauts", 4)
	a, b := dbName(long, 1), dbName(long, 1)
	if a == b {
		t.Errorf("two names alike: %s", a)
	}
	for _, n := range []string{a, b, dbName("T", 2)} {
		if len(n) > 63 || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
			t.Errorf("invalid database name %q", n)
		}
	}
}

// TestDeadlockReportsQuoteEachReportWhole: every "deadlock detected"
// ERROR of the server log comes back with the lines after it (the
// processes, the locks and the statement), and a log without one gives "".
func TestDeadlockReportsQuoteEachReportWhole(t *testing.T) {
	c := &cluster{dir: t.TempDir()}
	if got := c.deadlockReports(); got != "" {
		t.Fatalf("no log: %q, want empty", got)
	}
	log := strings.Join([]string{
		"2026-12-03 10:54:45.969 UTC [14506] ERROR:  new row violates check constraint",
		"2026-12-03 10:54:46.100 UTC [14600] ERROR:  deadlock detected",
		"2026-12-03 10:54:46.100 UTC [14600] DETAIL:  Process 14600 waits for ShareLock on transaction 901; blocked by process 14601.",
		"\tProcess 14601 waits for ShareLock on transaction 900; blocked by process 14600.",
		"2026-12-03 10:54:46.100 UTC [14600] STATEMENT:  UPDATE activations SET x = 1",
	}, "\n") + "\n"
	if err := os.WriteFile(c.logFile(), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got := c.deadlockReports()
	for _, want := range []string{"deadlock detected", "Process 14601 waits", "STATEMENT:  UPDATE activations"} {
		if !strings.Contains(got, want) {
			t.Errorf("reports %q lack %q", got, want)
		}
	}
	if strings.Contains(got, "check constraint") {
		t.Errorf("reports %q quote an unrelated error", got)
	}
}
