package wasm

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestGuestLogCutsLongLinesInLinearPieces: a line longer than maxLogLine
// is logged as pieces of maxLogLine bytes, whether or not a newline comes
// later in the same write (the write searches only the current line's
// room, so a long write without newlines costs linear time: found in
// review, it was quadratic), and what the budget cannot take is counted
// as dropped.
func TestGuestLogCutsLongLinesInLinearPieces(t *testing.T) {
	var out bytes.Buffer
	g := newGuestLog(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})), "sha256:x", 1<<20)
	g.startTurn("ref")
	long := strings.Repeat("a", 3*maxLogLine+10)
	g.write(0, []byte(long+"\nshort\n"+long))
	g.write(0, []byte("tail\n"))
	var sizes []int
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		_, msg, _ := strings.Cut(line, "msg=")
		msg, _, _ = strings.Cut(msg, " ")
		sizes = append(sizes, len(msg))
	}
	want := []int{maxLogLine, maxLogLine, maxLogLine, 10, 5, maxLogLine, maxLogLine, maxLogLine, 14}
	if len(sizes) != len(want) {
		t.Fatalf("%d records %v, want %v:\n%s", len(sizes), sizes, want, out.String())
	}
	for i := range want {
		if sizes[i] != want[i] {
			t.Errorf("record %d is %d bytes, want %d (all: %v)", i, sizes[i], want[i], sizes)
		}
	}

	// Past the budget, pieces are dropped and counted.
	out.Reset()
	g = newGuestLog(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})), "sha256:x", maxLogLine)
	g.startTurn("ref")
	g.write(0, []byte(strings.Repeat("b", 100*maxLogLine)+"\n"))
	if n := strings.Count(out.String(), "msg="); n != 1 || g.dropped != 99*maxLogLine {
		t.Errorf("%d records, %d bytes dropped; want 1 and %d", n, g.dropped, 99*maxLogLine)
	}
}
