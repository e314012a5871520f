package guard

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

var schemeSeq atomic.Int64

// newTestGuard creates a Guard with opts (quiet logger unless set) and
// registers it under a fresh scheme (zmq4's registry cannot unregister).
func newTestGuard(t *testing.T, opts Options) *Guard {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	g, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := g.Register(fmt.Sprintf("gtcptest%d", schemeSeq.Add(1))); err != nil {
		t.Fatalf("Register: %v", err)
	}
	return g
}

var quietLog = log.New(io.Discard, "", 0)

// startRouter binds a ROUTER on loopback with the given scheme ("tcp" or a
// guard scheme) and returns it with its host:port.
func startRouter(t *testing.T, scheme string, opts ...zmq4.Option) (zmq4.Socket, string) {
	t.Helper()
	opts = append([]zmq4.Option{zmq4.WithLogger(quietLog)}, opts...)
	r := zmq4.NewRouter(context.Background(), opts...)
	if err := r.Listen(scheme + "://127.0.0.1:0"); err != nil {
		t.Fatalf("router listen: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, r.Addr().String()
}

// echo replies to every message the router receives.
func echo(r zmq4.Socket) {
	go func() {
		for {
			msg, err := r.Recv()
			if err != nil {
				return
			}
			if err := r.Send(msg); err != nil {
				return
			}
		}
	}()
}

func newDealer(t *testing.T, id string) zmq4.Socket {
	t.Helper()
	d := zmq4.NewDealer(context.Background(), zmq4.WithID(zmq4.SocketIdentity(id)),
		zmq4.WithLogger(quietLog), zmq4.WithDialerMaxRetries(2), zmq4.WithDialerRetry(50*time.Millisecond))
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// dialDealer connects a DEALER to endpoint, failing the test after timeout.
func dialDealer(t *testing.T, id, endpoint string, timeout time.Duration) zmq4.Socket {
	t.Helper()
	d := newDealer(t, id)
	errc := make(chan error, 1)
	go func() { errc <- d.Dial(endpoint) }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("dealer %s dial %s: %v", id, endpoint, err)
		}
	case <-time.After(timeout):
		t.Fatalf("dealer %s dial %s: not connected after %v", id, endpoint, timeout)
	}
	return d
}

func recvTimeout(s zmq4.Socket, d time.Duration) (zmq4.Msg, error) {
	type res struct {
		m   zmq4.Msg
		err error
	}
	c := make(chan res, 1)
	go func() {
		m, err := s.Recv()
		c <- res{m, err}
	}()
	select {
	case r := <-c:
		return r.m, r.err
	case <-time.After(d):
		return zmq4.Msg{}, fmt.Errorf("recv: no message within %v", d)
	}
}

// roundTrip sends payload from a DEALER to an echoing ROUTER and waits for
// the echo; it returns the round-trip time.
func roundTrip(t *testing.T, d zmq4.Socket, payload string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := d.Send(zmq4.NewMsgString(payload)); err != nil {
		t.Fatalf("dealer send: %v", err)
	}
	m, err := recvTimeout(d, timeout)
	if err != nil {
		t.Fatalf("round trip %q: %v", payload, err)
	}
	if got := string(m.Frames[len(m.Frames)-1]); got != payload {
		t.Fatalf("round trip: got %q, want %q", got, payload)
	}
	return time.Since(start)
}

// waitFor polls cond every 5 ms until it holds or timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// --- raw ZMTP peer -----------------------------------------------------------

func dialRaw(t *testing.T, addr, localIP string) net.Conn {
	t.Helper()
	c, err := tryDialRaw(addr, localIP)
	if err != nil {
		t.Fatalf("raw dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// tryDialRaw dials TCP from localIP (any if ""). A guard that refuses the
// connection resets it, which can surface as a dial error.
func tryDialRaw(addr, localIP string) (net.Conn, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	if localIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(localIP)}
	}
	return d.Dial("tcp", addr)
}

// clientGreeting is a ZMTP greeting as libzmq 4.x sends it: a length in the
// signature padding, version 3.1, mechanism NULL.
func clientGreeting() []byte {
	g := make([]byte, 64)
	g[0] = 0xFF
	binary.BigEndian.PutUint64(g[1:9], 1)
	g[9] = 0x7F
	g[10], g[11] = 3, 1
	copy(g[12:], "NULL")
	return g
}

// zframe encodes one ZMTP frame; long forces the 8-byte size form.
func zframe(flags byte, body []byte, long bool) []byte {
	if len(body) > 255 || long {
		b := make([]byte, 9, 9+len(body))
		b[0] = flags | flagLong
		binary.BigEndian.PutUint64(b[1:], uint64(len(body)))
		return append(b, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// readyCmd encodes a READY command frame with the given name/value pairs.
func readyCmd(kv ...string) []byte {
	body := append([]byte{5}, "READY"...)
	for i := 0; i+1 < len(kv); i += 2 {
		body = append(body, byte(len(kv[i])))
		body = append(body, kv[i]...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(kv[i+1])))
		body = append(body, kv[i+1]...)
	}
	return zframe(flagCommand, body, false)
}

// rawHandshake performs a DEALER handshake with identity id over c, the
// libzmq way (signature first, rest after the server's signature), and
// returns a reader positioned after the server's READY.
func rawHandshake(t *testing.T, c net.Conn, id string) *bufio.Reader {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	defer c.SetDeadline(time.Time{})
	br := bufio.NewReader(c)
	g := clientGreeting()
	mustWrite(t, c, g[:10])
	var sg [64]byte
	if _, err := io.ReadFull(br, sg[:10]); err != nil {
		t.Fatalf("read server signature: %v", err)
	}
	mustWrite(t, c, g[10:])
	mustWrite(t, c, readyCmd("Socket-Type", "DEALER", "Identity", id))
	if _, err := io.ReadFull(br, sg[10:]); err != nil {
		t.Fatalf("read server greeting: %v", err)
	}
	readFrame(t, br) // server READY
	return br
}

func mustWrite(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	if _, err := c.Write(b); err != nil {
		t.Fatalf("raw write: %v", err)
	}
}

func readFrame(t *testing.T, br *bufio.Reader) (flags byte, body []byte) {
	t.Helper()
	flags, err := br.ReadByte()
	if err != nil {
		t.Fatalf("read frame flags: %v", err)
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			t.Fatalf("read frame size: %v", err)
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := br.ReadByte()
		if err != nil {
			t.Fatalf("read frame size: %v", err)
		}
		size = uint64(b)
	}
	body = make([]byte, size)
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatalf("read frame body: %v", err)
	}
	return flags, body
}

// expectClosed reads from c until the server closes it (EOF or reset) and
// fails if that takes longer than timeout.
func expectClosed(t *testing.T, c net.Conn, timeout time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 32<<10)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection %s not closed by the server within %v", c.LocalAddr(), timeout)
		}
		return
	}
}
