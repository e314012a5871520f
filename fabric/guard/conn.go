package guard

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// conn wraps a TCP connection handed to zmq4. Reads go through a ZMTP frame
// parser that enforces the size limits before zmq4 sees a frame's size; writes
// get a per-message deadline. Any limit violation or write error closes the
// TCP connection and is reported as a *CutError.
type conn struct {
	net.Conn
	g  *Guard
	l  *listener // nil for dialed connections
	id string    // peer identity (listener side)

	rmu sync.Mutex // serializes Read (zmq4 reads from one goroutine)
	fr  frameReader

	wmu       sync.Mutex // serializes Write
	swallow   int        // bytes of zmq4's greeting still to discard
	wParse    frameTracker
	wDeadline bool // a message deadline is armed
	wTimeout  time.Duration
	closeOnce sync.Once
	closeErr  error
	cutReason atomic.Pointer[error]
	// pendingPong is a PONG to write after the message in progress; wmu.
	pendingPong []byte
}

// newServerConn wraps an accepted connection whose pre-handshake read info
// (greeting and READY) from br.
func newServerConn(l *listener, c net.Conn, br *bufio.Reader, info peerInfo) *conn {
	gc := &conn{Conn: c, g: l.g, l: l, id: info.identity, swallow: greetingSize, wTimeout: l.g.opts.WriteTimeout}
	gc.fr = frameReader{
		src:    io.MultiReader(bytes.NewReader(info.replay), br),
		skip:   len(info.replay),
		opts:   &l.g.opts,
		cut:    gc.cut,
		onPing: gc.pong,
		g:      l.g,
	}
	// zmq4 leaks connections whose handshake it rejects itself (it neither
	// closes nor tracks them). If zmq4 has not started reading messages
	// from gc within HandshakeTimeout, close it.
	if t := l.g.opts.HandshakeTimeout; t > 0 {
		time.AfterFunc(t, func() {
			if !gc.fr.adopted.Load() {
				_ = gc.cut(ErrProtocol, errors.New("zmq4 did not adopt the connection"))
			}
		})
	}
	return gc
}

// newClientConn wraps a dialed connection: zmq4 performs the whole handshake;
// the parser passes the server greeting and its READY command through.
func newClientConn(g *Guard, c net.Conn) *conn {
	g.stats.dialed.Add(1)
	gc := &conn{Conn: c, g: g, wTimeout: g.opts.WriteTimeout}
	gc.wParse.skip = greetingSize
	gc.fr = frameReader{
		src:      bufio.NewReader(c),
		skip:     greetingSize,
		passCmds: 1,
		opts:     &g.opts,
		cut:      gc.cut,
		onPing:   gc.pong,
		g:        g,
	}
	return gc
}

// cut closes the connection for reason (an Err* sentinel) and returns the
// error to report. Only the first reason is counted.
func (c *conn) cut(reason, cause error) error {
	if c.cutReason.CompareAndSwap(nil, &reason) {
		c.g.stats.cut(reason)
		lvl := "warn"
		if reason == ErrDisconnected || reason == ErrHandedOver {
			lvl = "debug"
		}
		args := []any{"remote", c.RemoteAddr().String(), "identity", c.id, "reason", reason.Error()}
		if cause != nil {
			args = append(args, "cause", cause.Error())
		}
		if lvl == "warn" {
			c.g.opts.Logger.Warn("guard: connection cut", args...)
		} else {
			c.g.opts.Logger.Debug("guard: connection closed", args...)
		}
		// Reset rather than close gracefully: discard whatever is still
		// queued for a peer we gave up on.
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.closeTCP()
	}
	return &CutError{Reason: reason, Err: cause}
}

// Read implements net.Conn.
func (c *conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if r := c.cutReason.Load(); r != nil {
		return 0, &CutError{Reason: *r}
	}
	return c.fr.Read(p)
}

// Write implements net.Conn. The first 64 bytes written on an accepted
// connection are zmq4's greeting, which the guard already sent: they are
// checked and discarded.
func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if r := c.cutReason.Load(); r != nil {
		return 0, &CutError{Reason: *r}
	}
	done := 0
	if c.swallow > 0 {
		n := min(c.swallow, len(p))
		off := greetingSize - c.swallow
		if !bytes.Equal(p[:n], serverGreeting[off:off+n]) {
			return 0, c.cut(ErrProtocol, errors.New("zmq4 greeting differs from the guard's (socket not using NULL security?)"))
		}
		c.swallow -= n
		done = n
		p = p[n:]
		if len(p) == 0 {
			return done, nil
		}
	}
	if c.wTimeout > 0 && !c.wDeadline && c.wParse.atMessageStart() {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.wTimeout)); err != nil {
			return done, c.cut(ErrProtocol, fmt.Errorf("set write deadline: %w", err))
		}
		c.wDeadline = true
	}
	n, err := c.Conn.Write(p)
	done += n
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return done, c.cut(ErrWriteStalled, err)
		}
		// Any other write error means the connection is dead: close it so
		// the zmq4 reader goroutine ends too.
		c.closeTCP()
		return done, &CutError{Reason: ErrDisconnected, Err: err}
	}
	if c.wParse.feed(p) {
		if c.wDeadline {
			// A whole message went out: disarm until the next one starts.
			c.wDeadline = false
			if err := c.Conn.SetWriteDeadline(time.Time{}); err != nil {
				return done, c.cut(ErrProtocol, fmt.Errorf("clear write deadline: %w", err))
			}
		}
		if pp := c.pendingPong; pp != nil {
			c.pendingPong = nil
			if err := c.writeControl(pp); err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

// Close implements net.Conn.
func (c *conn) Close() error {
	c.closeTCP()
	return c.closeErr
}

func (c *conn) closeTCP() {
	c.closeOnce.Do(func() {
		c.closeErr = c.Conn.Close()
		if c.l != nil {
			c.l.connClosed(c)
		}
	})
}

// maxPingSize is the largest PING command body the guard answers: name (5),
// TTL (2) and up to 16 bytes of context.
const maxPingSize = 5 + 2 + 16

// pong answers a ZMTP 3.1 PING with a PONG carrying its context. It is
// written between outgoing messages: at once if none is in progress, else by
// the Write that ends the current one.
func (c *conn) pong(ctx []byte) error {
	frame := make([]byte, 0, 2+5+len(ctx))
	frame = append(frame, flagCommand, byte(5+len(ctx)))
	frame = append(frame, "\x04PONG"...)
	frame = append(frame, ctx...)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.cutReason.Load() != nil {
		return nil
	}
	if c.swallow > 0 || !c.wParse.atMessageStart() {
		c.pendingPong = frame
		return nil
	}
	return c.writeControl(frame)
}

// writeControl writes a guard-generated frame under WriteTimeout; the caller
// holds wmu and no message is in progress.
func (c *conn) writeControl(frame []byte) error {
	if c.wTimeout > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.wTimeout))
		defer c.Conn.SetWriteDeadline(time.Time{})
	}
	if _, err := c.Conn.Write(frame); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return c.cut(ErrWriteStalled, err)
		}
		c.closeTCP()
		return &CutError{Reason: ErrDisconnected, Err: err}
	}
	c.g.stats.pings.Add(1)
	return nil
}

// frameReader parses the ZMTP frames read from src and delivers their bytes
// unchanged, except that it never delivers the size field of a frame that
// exceeds the limits (it cuts the connection instead) and it drops
// post-handshake commands.
type frameReader struct {
	src      io.Reader
	skip     int // bytes to pass through unparsed (greeting / replay)
	passCmds int // command frames to deliver before dropping commands
	opts     *Options
	g        *Guard
	cut      func(reason, cause error) error
	onPing   func(context []byte) error // nil: PINGs are only dropped
	adopted  atomic.Bool                // a read past the skipped prefix happened

	hdr      [9]byte
	hdrLen   int
	hdrOff   int
	body     uint64 // body bytes of the current frame still to deliver
	inBody   bool
	msgBytes uint64 // declared bytes of the current multipart message
	msgFrame int    // frames of the current multipart message
}

func (f *frameReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		switch {
		case f.skip > 0:
			n, err := f.src.Read(p[:min(len(p), f.skip)])
			f.skip -= n
			return n, err
		case f.hdrOff < f.hdrLen:
			n := copy(p, f.hdr[f.hdrOff:f.hdrLen])
			f.hdrOff += n
			if f.hdrOff == f.hdrLen {
				f.inBody = f.body > 0
			}
			return n, nil
		case f.inBody:
			n, err := f.src.Read(p[:min(uint64(len(p)), f.body)])
			f.body -= uint64(n)
			if f.body == 0 {
				f.inBody = false
			}
			return n, err
		}
		f.adopted.Store(true)
		if err := f.nextHeader(); err != nil {
			return 0, err
		}
	}
}

// nextHeader reads one frame header, enforces the limits, and either queues
// it for delivery or discards a dropped command frame entirely.
func (f *frameReader) nextHeader() error {
	if _, err := io.ReadFull(f.src, f.hdr[:1]); err != nil {
		return err // EOF between frames is a normal close
	}
	flags := f.hdr[0]
	n := 1
	if flags&flagLong != 0 {
		n = 8
	}
	if _, err := io.ReadFull(f.src, f.hdr[1:1+n]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	var size uint64
	if n == 8 {
		size = binary.BigEndian.Uint64(f.hdr[1:9])
	} else {
		size = uint64(f.hdr[1])
	}
	if flags&flagCommand != 0 {
		if flags&flagMore != 0 || f.msgFrame > 0 {
			return f.cut(ErrProtocol, fmt.Errorf("command frame flags %#x inside a multipart message", flags))
		}
		if size > MaxCommandSize {
			return f.cut(ErrCommandTooLarge, fmt.Errorf("declared %d bytes, limit %d", size, MaxCommandSize))
		}
		if f.passCmds > 0 {
			f.passCmds--
			f.queue(1+n, size)
			return nil
		}
		// Drop the command; answer PINGs (libzmq heartbeats) ourselves,
		// since zmq4's ROUTER would hand them to the application.
		var body [maxPingSize]byte
		var err error
		if size <= maxPingSize {
			_, err = io.ReadFull(f.src, body[:size])
		} else {
			_, err = io.CopyN(io.Discard, f.src, int64(size))
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		f.g.stats.cmdsDropped.Add(1)
		if b := body[:min(size, maxPingSize)]; size <= maxPingSize && len(b) >= 7 &&
			string(b[:5]) == "\x04PING" && f.onPing != nil {
			return f.onPing(b[7:])
		}
		return nil
	}
	if max := f.opts.MaxFrameSize; max > 0 && size > uint64(max) {
		return f.cut(ErrFrameTooLarge, fmt.Errorf("declared %d bytes, limit %d", size, max))
	}
	f.msgFrame++
	f.msgBytes += size // cannot overflow: size <= MaxFrameSize, frames bounded
	if max := f.opts.MaxFramesPerMessage; max > 0 && f.msgFrame > max {
		return f.cut(ErrMessageTooLarge, fmt.Errorf("%d frames, limit %d", f.msgFrame, max))
	}
	if max := f.opts.MaxMessageSize; max > 0 && f.msgBytes > uint64(max) {
		return f.cut(ErrMessageTooLarge, fmt.Errorf("%d bytes, limit %d", f.msgBytes, max))
	}
	if f.opts.MaxFrameSize == 0 && f.msgBytes < size {
		return f.cut(ErrMessageTooLarge, errors.New("message size overflows"))
	}
	if flags&flagMore == 0 {
		f.msgFrame, f.msgBytes = 0, 0
	}
	f.queue(1+n, size)
	return nil
}

func (f *frameReader) queue(hdrLen int, size uint64) {
	f.hdrLen, f.hdrOff, f.body, f.inBody = hdrLen, 0, size, false
}

// frameTracker follows the ZMTP frames zmq4 writes to find message
// boundaries, so that the write deadline covers a whole message.
type frameTracker struct {
	skip   int     // unframed bytes (client greeting)
	hdr    [9]byte // header bytes collected so far
	hdrN   int
	body   uint64 // body bytes remaining in the current frame
	more   bool   // current frame has MORE set
	inBody bool
	midMsg bool // a message has started and not ended
}

func (t *frameTracker) atMessageStart() bool { return !t.midMsg }

// feed consumes written bytes and reports whether a message ended within them.
func (t *frameTracker) feed(p []byte) bool {
	ended := false
	for len(p) > 0 {
		switch {
		case t.skip > 0:
			n := min(t.skip, len(p))
			t.skip -= n
			p = p[n:]
		case t.inBody:
			n := min(uint64(len(p)), t.body)
			t.body -= n
			p = p[n:]
			if t.body == 0 {
				t.inBody = false
				if !t.more {
					t.midMsg, ended = false, true
				}
			}
		default:
			t.midMsg = true
			t.hdr[t.hdrN] = p[0]
			t.hdrN++
			p = p[1:]
			need := 2
			if t.hdr[0]&flagLong != 0 {
				need = 9
			}
			if t.hdrN < need {
				continue
			}
			if need == 9 {
				t.body = binary.BigEndian.Uint64(t.hdr[1:9])
			} else {
				t.body = uint64(t.hdr[1])
			}
			t.more = t.hdr[0]&flagMore != 0 && t.hdr[0]&flagCommand == 0
			t.hdrN = 0
			if t.body > 0 {
				t.inBody = true
			} else if !t.more {
				t.midMsg, ended = false, true
			}
		}
	}
	return ended
}
