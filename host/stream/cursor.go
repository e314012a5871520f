package stream

import (
	"fmt"
	"strconv"
	"strings"
)

// Cursor is a position in a session stream: what a client has seen. It is
// the SSE event id of the last event the client received (Last-Event-ID):
// "<seq>" after a whole frame, "<seq>.<j>" after the j-th (0-based) chunk
// of chunk frame seq. The zero Cursor is the start (nothing seen).
type Cursor struct {
	// Seq is the frame the client reached.
	Seq int64
	// Chunk is the index of the last chunk seen of frame Seq when InFrame
	// is set; without InFrame, frame Seq was seen whole.
	Chunk   int
	InFrame bool
}

// ParseCursor parses an SSE event id: "" (the start), "<seq>" or
// "<seq>.<j>", with seq ≥ 0 and j ≥ 0 decimal integers without signs.
// The error names the id and the expected shape.
func ParseCursor(id string) (Cursor, error) {
	id = strings.TrimSpace(id)
	if id == "" {
		return Cursor{}, nil
	}
	seqPart, chunkPart, chunked := strings.Cut(id, ".")
	seq, ok := parseUint(seqPart)
	if !ok {
		return Cursor{}, fmt.Errorf("stream position %q: want \"<seq>\" or \"<seq>.<chunk>\" (non-negative integers of at most 18 digits)", id)
	}
	c := Cursor{Seq: seq}
	if chunked {
		j, ok := parseUint(chunkPart)
		if !ok || j > 1<<30 || seq == 0 {
			return Cursor{}, fmt.Errorf("stream position %q: want \"<seq>\" or \"<seq>.<chunk>\" (non-negative integers of at most 18 digits, seq ≥ 1 with a chunk)", id)
		}
		c.Chunk, c.InFrame = int(j), true
	}
	return c, nil
}

func parseUint(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// String returns the cursor as an SSE event id: "<seq>" or "<seq>.<j>".
func (c Cursor) String() string {
	if c.InFrame {
		return strconv.FormatInt(c.Seq, 10) + "." + strconv.Itoa(c.Chunk)
	}
	return strconv.FormatInt(c.Seq, 10)
}

// IsZero reports whether c is the start of the stream.
func (c Cursor) IsZero() bool { return c == Cursor{} }

// need is the first frame the client still needs (some chunks of frame
// Seq, or frame Seq+1).
func (c Cursor) need() int64 {
	if c.InFrame {
		return c.Seq
	}
	return c.Seq + 1
}
