package guard

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ZMTP 3.x wire constants (https://rfc.zeromq.org/spec/23/).
const (
	greetingSize  = 64
	signatureSize = 10

	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// serverGreeting is the 64-byte greeting zmq4 v0.17.0 sends with NULL
// security: signature 0xFF 0*8 0x7F, version 3.0, mechanism "NULL", as-server
// 0, zero filler. The guard sends it before the pre-handshake (libzmq peers
// wait for the other side's signature before sending the rest of theirs) and
// swallows zmq4's identical copy later.
var serverGreeting = func() [greetingSize]byte {
	var g [greetingSize]byte
	g[0] = 0xFF
	g[9] = 0x7F
	g[10] = 3
	g[11] = 0
	copy(g[12:32], "NULL")
	return g
}()

// rejectError is a pre-handshake failure with its counting reason.
type rejectError struct {
	reason Reason
	err    error
}

func (e *rejectError) Error() string { return string(e.reason) + ": " + e.err.Error() }
func (e *rejectError) Unwrap() error { return e.err }

func reject(r Reason, format string, args ...any) error {
	return &rejectError{reason: r, err: fmt.Errorf(format, args...)}
}

// ioReject classifies an I/O error during the pre-handshake.
func ioReject(what string, err error) error {
	r := ReasonHandshakeIO
	if errors.Is(err, os.ErrDeadlineExceeded) {
		r = ReasonHandshakeTimeout
	}
	return &rejectError{reason: r, err: fmt.Errorf("%s: %w", what, err)}
}

// peerInfo is what the pre-handshake learned about the peer.
type peerInfo struct {
	socketType string
	identity   string
	identKey   string // the metadata property name carrying identity, as sent
	meta       map[string]string
	replay     []byte // the peer's greeting and READY frame, verbatim
}

// withIdentity returns info with its identity replaced by id and the READY
// frame in replay re-encoded to carry it (DuplicateDistinct).
func (info peerInfo) withIdentity(id string) peerInfo {
	meta := make(map[string]string, len(info.meta))
	for k, v := range info.meta {
		meta[k] = v
	}
	meta[info.identKey] = id
	body := []byte{5, 'R', 'E', 'A', 'D', 'Y'}
	for k, v := range meta {
		body = append(body, byte(len(k)))
		body = append(body, k...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(v)))
		body = append(body, v...)
	}
	frame := append([]byte(nil), info.replay[:greetingSize]...)
	if len(body) > 255 {
		frame = append(frame, flagCommand|flagLong)
		frame = binary.BigEndian.AppendUint64(frame, uint64(len(body)))
	} else {
		frame = append(frame, flagCommand, byte(len(body)))
	}
	info.replay = append(frame, body...)
	info.identity, info.meta = id, meta
	return info
}

// readHandshake reads and validates the peer's greeting and its READY
// command from br (the peer must not wait for our READY first, which holds
// for the NULL mechanism in libzmq and zmq4). The greeting is read in stages
// so that non-ZMTP clients are rejected after their first 10 bytes.
func readHandshake(br *bufio.Reader, allowedTypes []string) (peerInfo, error) {
	var info peerInfo
	buf := make([]byte, greetingSize, greetingSize+9+MaxCommandSize/64)

	if _, err := io.ReadFull(br, buf[:signatureSize]); err != nil {
		return info, ioReject("read signature", err)
	}
	// libzmq puts a length in bytes 1..8, so only bytes 0 and 9 are fixed.
	if buf[0] != 0xFF || buf[9] != 0x7F {
		return info, reject(ReasonBadSignature, "signature % x", buf[:signatureSize])
	}
	if _, err := io.ReadFull(br, buf[signatureSize:signatureSize+1]); err != nil {
		return info, ioReject("read version", err)
	}
	if buf[10] != 3 {
		return info, reject(ReasonBadVersion, "ZMTP major version %d, want 3", buf[10])
	}
	if _, err := io.ReadFull(br, buf[signatureSize+1:greetingSize]); err != nil {
		return info, ioReject("read greeting", err)
	}
	mech := buf[12:32]
	if end := indexZero(mech); string(mech[:end]) != "NULL" {
		return info, reject(ReasonBadMechanism, "mechanism %q, want NULL", mech[:end])
	}
	if buf[32] > 1 {
		return info, reject(ReasonBadServerFlag, "as-server byte %#x", buf[32])
	}

	// READY command frame.
	flags, err := br.ReadByte()
	if err != nil {
		return info, ioReject("read READY flags", err)
	}
	buf = append(buf, flags)
	if flags&flagCommand == 0 || flags&flagMore != 0 || flags&^(flagLong|flagCommand) != 0 {
		return info, reject(ReasonBadReady, "first frame flags %#x, want a command", flags)
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return info, ioReject("read READY size", err)
		}
		buf = append(buf, b[:]...)
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := br.ReadByte()
		if err != nil {
			return info, ioReject("read READY size", err)
		}
		buf = append(buf, b)
		size = uint64(b)
	}
	if size > MaxCommandSize {
		return info, reject(ReasonBadReady, "READY size %d > %d", size, MaxCommandSize)
	}
	start := len(buf)
	buf = append(buf, make([]byte, size)...)
	if _, err := io.ReadFull(br, buf[start:]); err != nil {
		return info, ioReject("read READY body", err)
	}
	meta, err := parseReady(buf[start:])
	if err != nil {
		return info, reject(ReasonBadReady, "%w", err)
	}
	for k, v := range meta {
		switch strings.ToLower(k) {
		case "socket-type":
			info.socketType = v
		case "identity":
			info.identity, info.identKey = v, k
		}
	}
	ok := false
	for _, t := range allowedTypes {
		if t == info.socketType { // zmq4 compares exactly
			ok = true
			break
		}
	}
	if !ok {
		return info, reject(ReasonPeerType, "peer socket type %q not accepted", info.socketType)
	}
	info.replay, info.meta = buf, meta
	return info, nil
}

// parseReady validates a READY command body (name and metadata properties,
// every length bounds-checked; zmq4 itself panics on some malformed ones) and
// returns its properties.
func parseReady(body []byte) (map[string]string, error) {
	if len(body) < 6 || body[0] != 5 || string(body[1:6]) != "READY" {
		return nil, errors.New("command is not READY")
	}
	meta := make(map[string]string)
	p := body[6:]
	for len(p) > 0 {
		klen := int(p[0])
		p = p[1:]
		if klen == 0 || len(p) < klen+4 {
			return nil, errors.New("malformed metadata property name")
		}
		k := string(p[:klen])
		p = p[klen:]
		vlen := binary.BigEndian.Uint32(p[:4])
		p = p[4:]
		if uint64(len(p)) < uint64(vlen) {
			return nil, fmt.Errorf("metadata property %q value length %d exceeds command", k, vlen)
		}
		lk := strings.ToLower(k)
		for old := range meta {
			if strings.ToLower(old) == lk {
				return nil, fmt.Errorf("duplicate metadata property %q", k)
			}
		}
		meta[k] = string(p[:vlen])
		p = p[vlen:]
	}
	return meta, nil
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}
