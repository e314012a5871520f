package guard

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"testing/iotest"
)

type cutRecorder struct{ reasons []error }

func (c *cutRecorder) cut(reason, cause error) error {
	c.reasons = append(c.reasons, reason)
	return &CutError{Reason: reason, Err: cause}
}

func newFrameReader(t *testing.T, src io.Reader, skip, passCmds int, o Options) (*frameReader, *cutRecorder, *Guard) {
	t.Helper()
	o.Logger = slog.New(slog.DiscardHandler)
	g, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	rec := &cutRecorder{}
	return &frameReader{src: src, skip: skip, passCmds: passCmds, opts: &g.opts, g: g, cut: rec.cut}, rec, g
}

func TestFrameReaderPassesValidStreamUnchanged(t *testing.T) {
	var in bytes.Buffer
	in.Write(clientGreeting())
	in.Write(readyCmd("Socket-Type", "ROUTER"))
	in.Write(zframe(flagMore, []byte("a"), false))
	in.Write(zframe(flagMore, nil, false))
	in.Write(zframe(0, bytes.Repeat([]byte("b"), 1000), false))
	in.Write(zframe(0, []byte("long-form"), true))
	want := bytes.Clone(in.Bytes())
	// A post-handshake command is dropped from the output.
	in.Write(zframe(flagCommand, []byte("\x04PING\x00\x00"), false))
	in.Write(zframe(0, []byte("z"), false))
	want = append(want, zframe(0, []byte("z"), false)...)

	fr, rec, g := newFrameReader(t, iotest.OneByteReader(&in), greetingSize, 1, Options{MaxFrameSize: 1024, MaxFramesPerMessage: 3})
	got, err := io.ReadAll(iotest.OneByteReader(fr))
	if err != nil {
		t.Fatalf("ReadAll: %v (cuts %v)", err, rec.reasons)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("stream changed:\n got %x\nwant %x", got, want)
	}
	if n := g.Stats().CommandsDropped; n != 1 {
		t.Fatalf("CommandsDropped = %d", n)
	}
}

// The size bytes of an oversized frame are never delivered.
func TestFrameReaderWithholdsOversizedHeader(t *testing.T) {
	cases := []struct {
		name   string
		frame  []byte
		reason error
	}{
		{"long", []byte{flagLong, 0, 0, 0, 0, 0x06, 0x40, 0, 0}, ErrFrameTooLarge}, // 100 MiB
		{"short-over-small-limit", zframe(0, make([]byte, 200), false), ErrFrameTooLarge},
		{"command", zframe(flagCommand, make([]byte, MaxCommandSize+1), true), ErrCommandTooLarge},
		{"multipart-command", zframe(flagCommand|flagMore, []byte("x"), false), ErrProtocol},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok := zframe(0, []byte("fine"), false)
			src := bytes.NewReader(append(append([]byte{}, ok...), tc.frame...))
			fr, rec, _ := newFrameReader(t, src, 0, 0, Options{MaxFrameSize: 100})
			var got []byte
			buf := make([]byte, 2) // zmq4 reads headers 2 bytes at a time
			var err error
			for err == nil {
				var n int
				n, err = fr.Read(buf)
				got = append(got, buf[:n]...)
			}
			if !bytes.Equal(got, ok) {
				t.Fatalf("delivered %x, want only the first frame %x", got, ok)
			}
			var ne net.Error
			if !errors.Is(err, tc.reason) || !errors.As(err, &ne) || ne.Timeout() {
				t.Fatalf("err = %v, want non-timeout net.Error wrapping %v", err, tc.reason)
			}
			if len(rec.reasons) != 1 {
				t.Fatalf("cuts = %v", rec.reasons)
			}
		})
	}
}

func TestFrameTrackerMessageBoundaries(t *testing.T) {
	var tr frameTracker
	msg := append(zframe(flagMore, []byte("id"), false), zframe(0, make([]byte, 300), false)...)
	for i := range msg[:len(msg)-1] {
		if tr.feed(msg[i : i+1]) {
			t.Fatalf("message ended early at byte %d", i)
		}
		if tr.atMessageStart() {
			t.Fatalf("at message start inside a message (byte %d)", i)
		}
	}
	if !tr.feed(msg[len(msg)-1:]) || !tr.atMessageStart() {
		t.Fatal("message end not detected")
	}
	if !tr.feed(zframe(flagCommand, []byte("\x05READY"), false)) {
		t.Fatal("command end not detected")
	}
	if !tr.feed(zframe(0, nil, false)) {
		t.Fatal("empty frame end not detected")
	}
}

func TestParseReady(t *testing.T) {
	good := readyCmd("Socket-Type", "DEALER", "Identity", "w1", "X-Extra", "")[2:]
	m, err := parseReady(good)
	if err != nil || m["Identity"] != "w1" || m["Socket-Type"] != "DEALER" {
		t.Fatalf("parseReady = %v, %v", m, err)
	}
	for _, bad := range []string{
		"\x05READY\x03abc",                // value length missing (panics zmq4)
		"\x05READY\x05abc",                // name longer than the body
		"\x05READY\x01a\x00\x00\x00\x09x", // value longer than the body
		"\x05READY\x00\x00\x00\x00\x00",   // empty name
		"\x05READX",
		"\x05READY\x01a\x00\x00\x00\x00\x01A\x00\x00\x00\x00", // duplicate
	} {
		if _, err := parseReady([]byte(bad)); err == nil {
			t.Errorf("parseReady(%q) accepted", bad)
		}
	}
}
