package calls

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// errStreamTooLarge ends a read past the call's response cap.
var errStreamTooLarge = errors.New("response exceeds the call's byte cap")

// cappedReader counts the bytes read and fails past max.
type cappedReader struct {
	r   io.Reader
	max int64
	n   int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.n > c.max {
		return 0, errStreamTooLarge
	}
	if rem := c.max + 1 - c.n; int64(len(p)) > rem {
		p = p[:rem]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		return n, errStreamTooLarge
	}
	return n, err
}

// sseEvent is one server-sent event: its type (empty when the stream
// names none) and its data lines joined by "\n".
type sseEvent struct {
	event string
	data  []byte
}

// readSSE reads server-sent events (text/event-stream) from r and calls fn
// for each; fn returns done to stop reading. It returns io.EOF-free nil
// when fn said done, io.ErrUnexpectedEOF when the stream ended first.
func readSSE(r io.Reader, fn func(ev sseEvent) (done bool, err error)) error {
	br := bufio.NewReaderSize(r, 32<<10)
	var ev sseEvent
	var data bytes.Buffer
	hasData := false
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			line = bytes.TrimRight(line, "\r\n")
			switch {
			case len(line) == 0:
				if hasData || ev.event != "" {
					ev.data = bytes.Clone(data.Bytes())
					done, ferr := fn(ev)
					if ferr != nil {
						return ferr
					}
					if done {
						return nil
					}
				}
				ev, hasData = sseEvent{}, false
				data.Reset()
			case line[0] == ':':
				// A comment (keep-alive).
			default:
				field, value, _ := bytes.Cut(line, []byte(":"))
				value = bytes.TrimPrefix(value, []byte(" "))
				switch string(field) {
				case "event":
					ev.event = string(value)
				case "data":
					if hasData {
						data.WriteByte('\n')
					}
					data.Write(value)
					hasData = true
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if hasData {
					ev.data = bytes.Clone(data.Bytes())
					done, ferr := fn(ev)
					if ferr != nil {
						return ferr
					}
					if done {
						return nil
					}
				}
				return io.ErrUnexpectedEOF
			}
			return fmt.Errorf("read stream: %w", err)
		}
	}
}
