// Package wire is the RuntimeFabric wire protocol, version 1: how a Paddock
// host and a remote worker exchange authenticated, replay-protected
// messages over a ZeroMQ ROUTER/DEALER pair. abi/FABRIC.md is the
// normative description; this package is its reference implementation and
// imports nothing of Paddock but abi.
//
// One fabric message is one single-frame ZMTP message (the host's ROUTER
// prepends the worker's routing identity). Its bytes are
//
//	offset size field
//	0      1    version      (1)
//	1      1    kind         (Kind)
//	2      2    reserved     (zero)
//	4      16   incarnation  (the worker process's incarnation id)
//	20     16   session      (zero in HELLO; chosen by the host otherwise)
//	36     8    seq          (big-endian uint64, per session and direction)
//	44     n    sealed body  (AES-256-GCM of the JSON body, 16-byte tag last)
//
// The body is sealed with a key derived from the worker's 32-byte secret,
// the incarnation and the session (HKDF-SHA256), under a nonce made of the
// direction and seq, with the 44 header bytes and the worker identity as
// associated data. So a message cannot be forged without the worker's key,
// moved to another worker, session or direction, or altered; replays are
// refused by the receiver's seq rule (Session.Accept).
package wire

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Version is the wire protocol version this package speaks (byte 0 of
// every message).
const Version = 1

// Sizes of the v1 layout, in bytes.
const (
	// HeaderLen is the length of the cleartext header.
	HeaderLen = 44
	// TagLen is the length of the AES-GCM authentication tag at the end of
	// the sealed body.
	TagLen = 16
	// MinMessageLen is the shortest valid message: a header and an empty
	// sealed body (its tag).
	MinMessageLen = HeaderLen + TagLen
	// KeyLen is the length of a worker's secret key.
	KeyLen = 32
	// IDLen is the length of incarnation and session ids.
	IDLen = 16
	// MaxIdentityLen bounds a worker id (the ZMTP routing identity).
	MaxIdentityLen = 64
)

// Default limits of v1. A host may configure lower ones.
const (
	// DefaultMaxMessageBytes bounds one message, header included (8 MiB):
	// an abi.MaxRequestBytes TurnRequest plus its JSON envelope fits.
	DefaultMaxMessageBytes = 8 << 20
	// MaxHelloBytes bounds a HELLO message.
	MaxHelloBytes = 64 << 10
	// MaxModuleChunk bounds the data of one MODULE message (256 KiB before
	// base64), so that no single message keeps a receiver busy for long.
	MaxModuleChunk = 256 << 10
	// MaxCallResultChunk bounds one CALL_RESULT: a CallResult whose JSON
	// is longer goes in chunks of at most this many bytes (before base64).
	MaxCallResultChunk = 1 << 20
)

// keyInfo is the HKDF info string of v1 session keys.
const keyInfo = "paddock fabric v1"

// Kind is the message kind, byte 1 of a message.
type Kind uint8

// Message kinds of v1. Lifecycle kinds are 0x01–0x0f, turn-lane kinds
// 0x10–0x1f, RPC kinds 0x20–0x2f.
const (
	KindHello     Kind = 0x01 // worker → host: join with a fresh incarnation
	KindWelcome   Kind = 0x02 // host → worker: session opened
	KindReject    Kind = 0x03 // host → worker: refused; start over
	KindHeartbeat Kind = 0x04 // worker → host: alive, free capacity, bytes received
	KindPing      Kind = 0x05 // host → worker: answer with PONG
	KindPong      Kind = 0x06 // worker → host: answer to PING
	KindGoodbye   Kind = 0x07 // either way: the session ends

	KindTurn     Kind = 0x10 // host → worker: run a turn
	KindAccepted Kind = 0x11 // worker → host: the turn is taken
	KindBusy     Kind = 0x12 // worker → host: no free capacity, not taken
	KindResult   Kind = 0x13 // worker → host: the TurnResult
	KindSteer    Kind = 0x14 // host → worker: a steer for the running turn
	KindCancel   Kind = 0x15 // host → worker: stop the turn
	KindProgress Kind = 0x16 // worker → host: observability only

	KindCall       Kind = 0x17 // worker → host: a host call of a running turn
	KindCallResult Kind = 0x18 // host → worker: a host call's result (or one chunk of it)

	KindFetchModule Kind = 0x20 // worker → host: a chunk of a wasm module
	KindModule      Kind = 0x21 // host → worker: the chunk

	KindError Kind = 0x7f // either way: a request or turn failed
)

var kindNames = map[Kind]string{
	KindHello: "HELLO", KindWelcome: "WELCOME", KindReject: "REJECT", KindHeartbeat: "HEARTBEAT",
	KindPing: "PING", KindPong: "PONG", KindGoodbye: "GOODBYE", KindTurn: "TURN", KindAccepted: "ACCEPTED",
	KindBusy: "BUSY", KindResult: "RESULT", KindSteer: "STEER", KindCancel: "CANCEL", KindProgress: "PROGRESS",
	KindCall: "CALL", KindCallResult: "CALL_RESULT",
	KindFetchModule: "FETCH_MODULE", KindModule: "MODULE", KindError: "ERROR",
}

// String returns the kind's name, e.g. "HELLO", or "0x42" for an unknown one.
func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("0x%02x", uint8(k))
}

// Known reports whether k is a v1 kind.
func (k Kind) Known() bool { _, ok := kindNames[k]; return ok }

// FromWorker reports whether workers send k (ERROR and GOODBYE go both
// ways and report true for both FromWorker and FromHost).
func (k Kind) FromWorker() bool {
	switch k {
	case KindHello, KindHeartbeat, KindPong, KindGoodbye, KindAccepted, KindBusy, KindResult,
		KindProgress, KindCall, KindFetchModule, KindError:
		return true
	}
	return false
}

// FromHost reports whether hosts send k.
func (k Kind) FromHost() bool {
	switch k {
	case KindWelcome, KindReject, KindPing, KindGoodbye, KindTurn, KindSteer, KindCancel, KindCallResult, KindModule, KindError:
		return true
	}
	return false
}

// Direction is the first byte of the AEAD nonce: who sealed the message.
type Direction byte

// Directions.
const (
	// ToHost: sealed by the worker ('W').
	ToHost Direction = 'W'
	// ToWorker: sealed by the host ('H').
	ToWorker Direction = 'H'
)

// ID is a 16-byte incarnation or session id.
type ID [IDLen]byte

// NewID returns a random ID from crypto/rand.
func NewID() ID {
	var id ID
	if _, err := rand.Read(id[:]); err != nil {
		panic(fmt.Sprintf("wire: crypto/rand: %v", err)) // never fails on supported platforms
	}
	return id
}

// IsZero reports whether id is all zero (the session of a HELLO).
func (id ID) IsZero() bool { return id == ID{} }

// String is the lowercase hex form.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Header is the cleartext first HeaderLen bytes of a message.
type Header struct {
	Version     uint8
	Kind        Kind
	Incarnation ID
	Session     ID
	Seq         uint64
}

// Errors of ParseHeader and Session.Open, for the receiver's drop counters.
var (
	// ErrShort: fewer than MinMessageLen bytes.
	ErrShort = errors.New("wire: message shorter than header and tag")
	// ErrReserved: reserved header bits are set.
	ErrReserved = errors.New("wire: reserved header bytes are not zero")
	// ErrForged: the message does not authenticate under the session key
	// (wrong key, altered bytes, or another identity, session or direction).
	ErrForged = errors.New("wire: message does not authenticate")
	// ErrReplayed: the seq is not above the last accepted one.
	ErrReplayed = errors.New("wire: replayed or reordered message")
)

// VersionError is returned by ParseHeader for a message of another
// protocol version.
type VersionError struct{ Got uint8 }

func (e *VersionError) Error() string {
	return fmt.Sprintf("wire: message of protocol version %d, this side speaks %d", e.Got, Version)
}

// ParseHeader reads the header of msg. Errors: ErrShort, *VersionError
// (byte 0 is not Version; checked first, for any length ≥ 1), ErrReserved.
func ParseHeader(msg []byte) (Header, error) {
	if len(msg) >= 1 && msg[0] != Version {
		return Header{}, &VersionError{Got: msg[0]}
	}
	if len(msg) < MinMessageLen {
		return Header{}, ErrShort
	}
	if msg[2] != 0 || msg[3] != 0 {
		return Header{}, ErrReserved
	}
	var h Header
	h.Version = msg[0]
	h.Kind = Kind(msg[1])
	copy(h.Incarnation[:], msg[4:20])
	copy(h.Session[:], msg[20:36])
	h.Seq = binary.BigEndian.Uint64(msg[36:44])
	return h, nil
}

func (h Header) put(b []byte) {
	b[0] = h.Version
	b[1] = byte(h.Kind)
	b[2], b[3] = 0, 0
	copy(b[4:20], h.Incarnation[:])
	copy(b[20:36], h.Session[:])
	binary.BigEndian.PutUint64(b[36:44], h.Seq)
}

// DeriveKey returns the AES-256 key of one session:
// HKDF-SHA256(secret = key, salt = incarnation ‖ session, info = "paddock fabric v1"), 32 bytes.
func DeriveKey(key []byte, incarnation, session ID) ([]byte, error) {
	if len(key) != KeyLen {
		return nil, fmt.Errorf("wire: key is %d bytes, want %d", len(key), KeyLen)
	}
	salt := make([]byte, 0, 2*IDLen)
	salt = append(salt, incarnation[:]...)
	salt = append(salt, session[:]...)
	return hkdf.Key(sha256.New, key, salt, keyInfo, 32)
}

// Session seals and opens the messages of one (worker identity,
// incarnation, session). Seal and Open are safe for concurrent use; Accept
// and NextSeq are not (each belongs to the one goroutine that receives,
// respectively sends, on the session).
type Session struct {
	identity    []byte
	incarnation ID
	session     ID
	aead        cipher.AEAD

	lastRecv uint64 // highest seq accepted (receiver)
	lastSent uint64 // highest seq sealed by NextSeq (sender)
}

// NewSession prepares the keys of one session of the worker identity.
func NewSession(key []byte, identity string, incarnation, session ID) (*Session, error) {
	if err := CheckIdentity(identity); err != nil {
		return nil, err
	}
	k, err := DeriveKey(key, incarnation, session)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, fmt.Errorf("wire: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("wire: %w", err)
	}
	return &Session{identity: []byte(identity), incarnation: incarnation, session: session, aead: aead}, nil
}

// Incarnation returns the session's incarnation id.
func (s *Session) Incarnation() ID { return s.incarnation }

// ID returns the session id.
func (s *Session) ID() ID { return s.session }

// nonce is dir ‖ 0 0 0 ‖ seq (big endian).
func nonce(dir Direction, seq uint64) []byte {
	n := make([]byte, 12)
	n[0] = byte(dir)
	binary.BigEndian.PutUint64(n[4:], seq)
	return n
}

// ad is the associated data: the header bytes and the worker identity.
func (s *Session) ad(hdr []byte) []byte {
	ad := make([]byte, 0, HeaderLen+len(s.identity))
	ad = append(ad, hdr[:HeaderLen]...)
	return append(ad, s.identity...)
}

// NextSeq returns the next seq to send on the session: 1, 2, 3, …
func (s *Session) NextSeq() uint64 {
	s.lastSent++
	return s.lastSent
}

// Seal returns the message of kind with the JSON body, sealed in
// direction dir with seq. A (session, direction, seq) must never be sealed
// twice: seqs come from NextSeq.
func (s *Session) Seal(dir Direction, kind Kind, seq uint64, body []byte) []byte {
	msg := make([]byte, HeaderLen, HeaderLen+len(body)+TagLen)
	Header{Version: Version, Kind: kind, Incarnation: s.incarnation, Session: s.session, Seq: seq}.put(msg)
	return s.aead.Seal(msg, nonce(dir, seq), body, s.ad(msg))
}

// Open authenticates msg, sealed in direction dir on this session, and
// returns its header and body. It does not check the seq (Accept does).
// Errors: those of ParseHeader, ErrForged (also for a message of another
// session).
func (s *Session) Open(dir Direction, msg []byte) (Header, []byte, error) {
	h, err := ParseHeader(msg)
	if err != nil {
		return h, nil, err
	}
	if h.Incarnation != s.incarnation || h.Session != s.session {
		return h, nil, ErrForged
	}
	body, err := s.aead.Open(nil, nonce(dir, h.Seq), msg[HeaderLen:], s.ad(msg))
	if err != nil {
		return h, nil, ErrForged
	}
	return h, body, nil
}

// Accept applies the replay rule to an authenticated message's seq: it
// must be above every seq accepted before on this session (gaps are
// allowed: a message may be lost, never replayed or reordered). It
// returns ErrReplayed otherwise. Call it only after Open succeeded, so a
// forged seq never advances the counter.
func (s *Session) Accept(seq uint64) error {
	if seq <= s.lastRecv {
		return ErrReplayed
	}
	s.lastRecv = seq
	return nil
}

// CheckIdentity checks a worker id: 1–64 bytes of [A-Za-z0-9._-].
func CheckIdentity(id string) error {
	if id == "" || len(id) > MaxIdentityLen {
		return fmt.Errorf("wire: worker id %q must be 1–%d bytes", id, MaxIdentityLen)
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return fmt.Errorf("wire: worker id %q may only hold letters, digits, '.', '_' and '-'", id)
		}
	}
	return nil
}

// ParseKey decodes a worker key written as 64 hex digits or as standard
// base64 (44 characters), optionally prefixed "hex:" or "base64:".
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	var (
		k   []byte
		err error
	)
	switch {
	case strings.HasPrefix(s, "hex:"):
		k, err = hex.DecodeString(s[4:])
	case strings.HasPrefix(s, "base64:"):
		k, err = base64.StdEncoding.DecodeString(s[7:])
	case len(s) == 2*KeyLen:
		k, err = hex.DecodeString(s)
	default:
		k, err = base64.StdEncoding.DecodeString(s)
	}
	if err != nil {
		return nil, fmt.Errorf("wire: key is neither 64 hex digits nor base64: %w", err)
	}
	if len(k) != KeyLen {
		return nil, fmt.Errorf("wire: key is %d bytes, want %d", len(k), KeyLen)
	}
	return k, nil
}

// NewKey returns a random worker key.
func NewKey() []byte {
	k := make([]byte, KeyLen)
	if _, err := rand.Read(k); err != nil {
		panic(fmt.Sprintf("wire: crypto/rand: %v", err))
	}
	return k
}
