package wire

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParseHeader: any bytes either parse as a v1 header or are refused
// with one of ParseHeader's documented errors (a *VersionError exactly when
// byte 0 is not Version); a parsed header writes back to the same 44 bytes.
func FuzzParseHeader(f *testing.F) {
	key := NewKey()
	s, _ := NewSession(key, "w1", NewID(), NewID())
	f.Add(s.Seal(ToHost, KindHeartbeat, 1, []byte(`{"free":1}`)))
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 1, 0, 0})
	f.Add(append([]byte{1, 0x42, 0, 1}, make([]byte, 60)...))
	f.Add(make([]byte, MinMessageLen))
	f.Fuzz(func(t *testing.T, msg []byte) {
		h, err := ParseHeader(msg)
		var ve *VersionError
		switch {
		case len(msg) >= 1 && msg[0] != Version:
			if !errors.As(err, &ve) || ve.Got != msg[0] {
				t.Fatalf("version byte %d: %v, want a *VersionError", msg[0], err)
			}
		case len(msg) < MinMessageLen:
			if !errors.Is(err, ErrShort) {
				t.Fatalf("%d bytes: %v, want ErrShort", len(msg), err)
			}
		case msg[2] != 0 || msg[3] != 0:
			if !errors.Is(err, ErrReserved) {
				t.Fatalf("reserved bytes set: %v, want ErrReserved", err)
			}
		default:
			if err != nil {
				t.Fatalf("a well-formed header is refused: %v", err)
			}
			out := make([]byte, HeaderLen)
			h.put(out)
			if !bytes.Equal(out, msg[:HeaderLen]) {
				t.Fatalf("header %x writes back as %x", msg[:HeaderLen], out)
			}
		}
	})
}

// FuzzSessionOpen: a sealed message opens to its header and body on the
// receiving side, once (a replay is ErrReplayed); flipping any one bit,
// opening it in the other direction or on another session fails with
// ErrForged (or the header's own error); and Open never panics on bytes
// that were never sealed.
func FuzzSessionOpen(f *testing.F) {
	f.Add(uint8(KindHeartbeat), uint64(1), []byte(`{"free":1}`), uint32(50), []byte{1, 4, 0, 0})
	f.Add(uint8(KindResult), uint64(1<<63), []byte{}, uint32(0), []byte{})
	f.Add(uint8(0x7f), uint64(0), []byte("\x00\xff"), uint32(1000), bytes.Repeat([]byte{1, 0, 0, 0}, 20))
	key := NewKey()
	inc, sid := NewID(), NewID()
	f.Fuzz(func(t *testing.T, kind uint8, seq uint64, body []byte, flip uint32, junk []byte) {
		tx, err := NewSession(key, "w1", inc, sid)
		if err != nil {
			t.Fatal(err)
		}
		rx, _ := NewSession(key, "w1", inc, sid)
		msg := tx.Seal(ToHost, Kind(kind), seq, body)
		h, got, err := rx.Open(ToHost, msg)
		if err != nil {
			t.Fatalf("a sealed message does not open: %v", err)
		}
		if h.Kind != Kind(kind) || h.Seq != seq || h.Incarnation != inc || h.Session != sid || !bytes.Equal(got, body) {
			t.Fatalf("opened %+v %q, sealed kind %d seq %d %q", h, got, kind, seq, body)
		}
		if seq > 0 {
			if err := rx.Accept(seq); err != nil {
				t.Fatalf("first accept of seq %d: %v", seq, err)
			}
		}
		if err := rx.Accept(seq); !errors.Is(err, ErrReplayed) {
			t.Fatalf("second accept of seq %d: %v, want ErrReplayed", seq, err)
		}
		bit := int(flip) % (8 * len(msg))
		m := bytes.Clone(msg)
		m[bit/8] ^= 1 << (bit % 8)
		if _, _, err := rx.Open(ToHost, m); err == nil {
			t.Fatalf("flipping bit %d still opens", bit)
		}
		if _, _, err := rx.Open(ToWorker, msg); !errors.Is(err, ErrForged) {
			t.Fatalf("the other direction: %v, want ErrForged", err)
		}
		other, _ := NewSession(key, "w1", inc, NewID())
		if _, _, err := other.Open(ToHost, msg); !errors.Is(err, ErrForged) {
			t.Fatalf("another session: %v, want ErrForged", err)
		}
		if _, _, err := rx.Open(ToHost, junk); err == nil && !bytes.Equal(junk, msg) {
			t.Fatalf("bytes never sealed opened: %x", junk)
		}
	})
}
