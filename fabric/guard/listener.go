package guard

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// preReadBuffer is the bufio size in bytes used per connection for the
// pre-handshake and then for the frame parser.
const preReadBuffer = 4 << 10

// listener is the net.Listener given to zmq4. Its own goroutine accepts TCP
// connections; each one gets a pre-handshake goroutine; zmq4's Accept only
// receives connections that passed.
type listener struct {
	g       *Guard
	ln      net.Listener
	ready   chan net.Conn
	done    chan struct{}
	onClose func()

	closeOnce sync.Once
	wg        sync.WaitGroup

	mu      sync.Mutex
	pending map[net.Conn]netip.Addr // connections in pre-handshake
	perIP   map[netip.Addr]int
	open    map[*conn]struct{}            // handed to zmq4, not closed
	byID    map[string]map[*conn]struct{} // open, by non-empty identity
}

func newListener(g *Guard, ln net.Listener) *listener {
	return &listener{
		g:       g,
		ln:      ln,
		ready:   make(chan net.Conn),
		done:    make(chan struct{}),
		pending: make(map[net.Conn]netip.Addr),
		perIP:   make(map[netip.Addr]int),
		open:    make(map[*conn]struct{}),
		byID:    make(map[string]map[*conn]struct{}),
	}
}

// Accept implements net.Listener. It returns an error only once the listener
// is closed (zmq4's accept loop retries errors in a tight loop).
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		l.g.stats.admitted.Add(1)
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("guard: accept: %w", net.ErrClosed)
	}
}

// Addr implements net.Listener.
func (l *listener) Addr() net.Addr { return l.ln.Addr() }

// Close implements net.Listener: it stops accepting, aborts pre-handshakes and
// waits for the guard's goroutines. Established connections are left to
// zmq4, which closes them when the socket closes.
func (l *listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.ln.Close()
		l.mu.Lock()
		for c := range l.pending {
			_ = c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
		if l.onClose != nil {
			l.onClose()
		}
	})
	if err != nil {
		return fmt.Errorf("guard: close listener: %w", err)
	}
	return nil
}

func (l *listener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// start launches the accept loop.
func (l *listener) start() {
	l.wg.Add(1)
	go l.acceptLoop()
}

func (l *listener) acceptLoop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if l.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: back off like net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.g.opts.Logger.Warn("guard: accept failed", "err", err.Error(), "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-l.done:
				return
			}
			continue
		}
		backoff = 0
		l.g.stats.accepted.Add(1)
		ip := sourceKey(c.RemoteAddr())
		if r, ok := l.admitPending(c, ip); !ok {
			l.g.stats.reject(r)
			l.g.opts.Logger.Debug("guard: connection refused", "remote", c.RemoteAddr().String(), "reason", string(r))
			abort(c)
			continue
		}
		l.wg.Add(1)
		go l.handshake(c, ip)
	}
}

// sourceKey groups peers for MaxPendingPerIP: the IPv4 address, or the /64
// of an IPv6 address.
func sourceKey(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip := ta.AddrPort().Addr().Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// abort closes c with an RST so rejected connections free their resources
// at once.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (l *listener) admitPending(c net.Conn, ip netip.Addr) (Reason, bool) {
	o := &l.g.opts
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed():
		return ReasonHandshakeIO, false
	case o.MaxConns > 0 && len(l.open)+len(l.pending) >= o.MaxConns:
		return ReasonConnLimit, false
	case o.MaxPending > 0 && len(l.pending) >= o.MaxPending:
		return ReasonFlood, false
	case o.MaxPendingPerIP > 0 && l.perIP[ip] >= o.MaxPendingPerIP:
		return ReasonFloodPerIP, false
	}
	l.pending[c] = ip
	l.perIP[ip]++
	l.g.stats.pending.Add(1)
	return "", true
}

func (l *listener) releasePending(c net.Conn, ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.pending[c]; !ok {
		return
	}
	delete(l.pending, c)
	if l.perIP[ip]--; l.perIP[ip] <= 0 {
		delete(l.perIP, ip)
	}
	l.g.stats.pending.Add(-1)
}

// handshake runs the pre-handshake of c under HandshakeTimeout and hands the
// wrapped connection to zmq4's Accept.
func (l *listener) handshake(c net.Conn, ip netip.Addr) {
	defer l.wg.Done()
	o := &l.g.opts
	gc, err := l.preHandshake(c)
	if err != nil {
		l.releasePending(c, ip)
		var re *rejectError
		r := ReasonHandshakeIO
		if errors.As(err, &re) {
			r = re.reason
		}
		if l.closed() {
			r = ReasonHandshakeIO
		}
		l.g.stats.reject(r)
		o.Logger.Debug("guard: handshake rejected", "remote", c.RemoteAddr().String(), "reason", string(r), "err", err.Error())
		abort(c)
		return
	}
	// Register before releasing the pending slot, so MaxConns holds.
	if r, ok := l.register(gc); !ok {
		l.releasePending(c, ip)
		l.g.stats.reject(r)
		o.Logger.Debug("guard: connection refused", "remote", c.RemoteAddr().String(), "identity", gc.id, "reason", string(r))
		abort(c)
		return
	}
	l.releasePending(c, ip)
	select {
	case l.ready <- gc:
	case <-l.done:
		_ = gc.Close()
	}
}

func (l *listener) preHandshake(c net.Conn) (*conn, error) {
	o := &l.g.opts
	if o.HandshakeTimeout > 0 {
		if err := c.SetDeadline(time.Now().Add(o.HandshakeTimeout)); err != nil {
			return nil, fmt.Errorf("set deadline: %w", err)
		}
	}
	if _, err := c.Write(serverGreeting[:]); err != nil {
		return nil, ioReject("write greeting", err)
	}
	br := bufio.NewReaderSize(c, preReadBuffer)
	info, err := readHandshake(br, o.PeerSocketTypes)
	if err != nil {
		return nil, err
	}
	if o.DuplicateIdentity == DuplicateDistinct && info.identity != "" {
		if strings.Contains(info.identity, IdentitySeparator) {
			return nil, reject(ReasonBadReady, "identity %q contains the routing separator", info.identity)
		}
		info = info.withIdentity(fmt.Sprintf("%s%s%016x", info.identity, IdentitySeparator, l.g.connSeq.Add(1)))
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("clear deadline: %w", err)
	}
	return newServerConn(l, c, br, info), nil
}

// register records gc as open, applying the duplicate-identity policy.
func (l *listener) register(gc *conn) (Reason, bool) {
	var old []*conn
	l.mu.Lock()
	if gc.id != "" {
		set := l.byID[gc.id]
		if len(set) > 0 {
			switch l.g.opts.DuplicateIdentity {
			case DuplicateReject:
				l.mu.Unlock()
				return ReasonDuplicate, false
			case DuplicateHandover:
				for c := range set {
					old = append(old, c)
				}
			}
		}
		if set == nil {
			set = make(map[*conn]struct{})
			l.byID[gc.id] = set
		}
		set[gc] = struct{}{}
	}
	l.open[gc] = struct{}{}
	l.g.stats.open.Add(1)
	l.mu.Unlock()
	for _, c := range old {
		_ = c.cut(ErrHandedOver, nil)
	}
	return "", true
}

// connClosed is called once when an open connection closes.
func (l *listener) connClosed(gc *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.open[gc]; !ok {
		return
	}
	delete(l.open, gc)
	l.g.stats.open.Add(-1)
	if set := l.byID[gc.id]; set != nil {
		delete(set, gc)
		if len(set) == 0 {
			delete(l.byID, gc.id)
		}
	}
}

func (l *listener) disconnect(id string) int {
	l.mu.Lock()
	var cs []*conn
	for c := range l.byID[id] {
		cs = append(cs, c)
	}
	l.mu.Unlock()
	for _, c := range cs {
		_ = c.cut(ErrDisconnected, nil)
	}
	return len(cs)
}

func (l *listener) peers() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, 0, len(l.open))
	for c := range l.open {
		ids = append(ids, c.id)
	}
	return ids
}
