package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func testSession(t *testing.T, key []byte, id string, inc, sid ID) *Session {
	t.Helper()
	s, err := NewSession(key, id, inc, sid)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSealOpenRoundTrip(t *testing.T) {
	key := NewKey()
	inc, sid := NewID(), NewID()
	tx := testSession(t, key, "w1", inc, sid)
	rx := testSession(t, key, "w1", inc, sid)
	body := []byte(`{"free":2}`)
	msg := tx.Seal(ToHost, KindHeartbeat, tx.NextSeq(), body)
	if len(msg) != HeaderLen+len(body)+TagLen {
		t.Fatalf("message is %d bytes, want %d", len(msg), HeaderLen+len(body)+TagLen)
	}
	h, got, err := rx.Open(ToHost, msg)
	if err != nil {
		t.Fatal(err)
	}
	if h.Kind != KindHeartbeat || h.Seq != 1 || h.Incarnation != inc || h.Session != sid || !bytes.Equal(got, body) {
		t.Fatalf("opened %+v %q", h, got)
	}
	if err := rx.Accept(h.Seq); err != nil {
		t.Fatal(err)
	}
	if err := rx.Accept(h.Seq); !errors.Is(err, ErrReplayed) {
		t.Fatalf("second accept of seq 1: %v, want ErrReplayed", err)
	}
}

// Every byte of a message is covered: the header as associated data, the
// body by the tag; and the identity, the key and the direction matter.
func TestForgeriesDoNotAuthenticate(t *testing.T) {
	key := NewKey()
	inc, sid := NewID(), NewID()
	s := testSession(t, key, "w1", inc, sid)
	msg := s.Seal(ToHost, KindResult, s.NextSeq(), []byte(`{"delivery_id":"d1"}`))
	for i := range msg {
		if i == 0 || i == 2 || i == 3 {
			continue // version and reserved bytes fail earlier, below
		}
		m := bytes.Clone(msg)
		m[i] ^= 0x01
		if _, _, err := s.Open(ToHost, m); err == nil {
			t.Fatalf("flipping byte %d still authenticates", i)
		}
	}
	if _, _, err := s.Open(ToWorker, msg); !errors.Is(err, ErrForged) {
		t.Fatalf("other direction: %v", err)
	}
	if _, _, err := testSession(t, key, "w2", inc, sid).Open(ToHost, msg); !errors.Is(err, ErrForged) {
		t.Fatalf("other identity: %v", err)
	}
	if _, _, err := testSession(t, NewKey(), "w1", inc, sid).Open(ToHost, msg); !errors.Is(err, ErrForged) {
		t.Fatalf("other key: %v", err)
	}
	m := bytes.Clone(msg)
	m[0] = 2
	var ve *VersionError
	if _, _, err := s.Open(ToHost, m); !errors.As(err, &ve) || ve.Got != 2 {
		t.Fatalf("version 2: %v", err)
	}
	m = bytes.Clone(msg)
	m[3] = 1
	if _, _, err := s.Open(ToHost, m); !errors.Is(err, ErrReserved) {
		t.Fatalf("reserved byte: %v", err)
	}
	if _, err := ParseHeader(msg[:MinMessageLen-1]); !errors.Is(err, ErrShort) {
		t.Fatalf("short: %v", err)
	}
}

// A fixed vector, so that an implementation in another language can check
// its key derivation, nonce and associated data (abi/FABRIC.md, "Test
// vector"). It was cross-checked with Python's hmac/hashlib (HKDF by hand)
// and the cryptography package's AESGCM.
func TestVector(t *testing.T) {
	key, _ := hex.DecodeString("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	var inc, sid ID
	for i := range inc {
		inc[i] = byte(0xa0 + i)
		sid[i] = byte(0xb0 + i)
	}
	k, err := DeriveKey(key, inc, sid)
	if err != nil {
		t.Fatal(err)
	}
	s := testSession(t, key, "worker-1", inc, sid)
	msg := s.Seal(ToHost, KindHeartbeat, 7, []byte(`{"free":1,"running":0,"rx_bytes":0}`))
	gotKey, gotMsg := hex.EncodeToString(k), hex.EncodeToString(msg)
	if testing.Verbose() {
		t.Logf("session key %s", gotKey)
		t.Logf("message %s", gotMsg)
	}
	if gotKey != vectorKey || gotMsg != vectorMsg {
		t.Fatalf("vector changed:\nkey %s\nmsg %s", gotKey, gotMsg)
	}
}

const (
	vectorKey = "aec17e2b3a15c85e25bd8784f2b09403f97fa315c15616d29f9582aca8e683c6"
	vectorMsg = "01040000a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf0000000000000007fb53a725d8872e92d0697e182c464d49b9005fd2d0fad36d90122f6ad8f8f1549d65741e66a1b6a30a7a20903c760441f230db"
)

func TestParseKey(t *testing.T) {
	k := NewKey()
	for _, s := range []string{hex.EncodeToString(k), "hex:" + hex.EncodeToString(k)} {
		got, err := ParseKey(s)
		if err != nil || !bytes.Equal(got, k) {
			t.Fatalf("ParseKey(%q) = %x, %v", s, got, err)
		}
	}
	if _, err := ParseKey("abcd"); err == nil {
		t.Fatal("short key accepted")
	}
}
