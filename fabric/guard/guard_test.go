package guard

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

func TestRegisterIdempotent(t *testing.T) {
	if err := Register(); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := Register(); err != nil {
		t.Fatalf("second Register: %v", err)
	}
	g := Default()
	if g == nil || g.Scheme() != DefaultScheme {
		t.Fatalf("Default() = %v", g)
	}
	if got := g.Options(); got.MaxFrameSize != DefaultMaxFrameSize || got.HandshakeTimeout != DefaultHandshakeTimeout {
		t.Fatalf("default options not applied: %+v", got)
	}
	if err := g.Register(DefaultScheme); err == nil {
		t.Fatal("registering a scheme twice should fail")
	}
	if _, err := New(Options{MaxFrameSize: 10 << 20, MaxMessageSize: 1 << 20}); err == nil {
		t.Fatal("MaxMessageSize < MaxFrameSize should be rejected")
	}
}

// Default "gtcp" guard: a DEALER dialing tcp:// and one dialing gtcp://
// both round-trip through a ROUTER bound on gtcp://.
func TestRoundTripTCPAndGTCP(t *testing.T) {
	if err := Register(); err != nil {
		t.Fatal(err)
	}
	r, addr := startRouter(t, DefaultScheme)
	echo(r)
	before := Default().Stats()
	d1 := dialDealer(t, "w-tcp", "tcp://"+addr, 2*time.Second)
	d2 := dialDealer(t, "w-gtcp", "gtcp://"+addr, 2*time.Second)
	for i := range 50 {
		roundTrip(t, d1, fmt.Sprintf("tcp-%d", i), 2*time.Second)
		roundTrip(t, d2, fmt.Sprintf("gtcp-%d", i), 2*time.Second)
	}
	// Large message, close to the frame limit, both directions.
	big := strings.Repeat("x", 4<<20)
	roundTrip(t, d2, big, 5*time.Second)
	after := Default().Stats()
	if after.Admitted-before.Admitted != 2 || after.Dialed-before.Dialed != 1 {
		t.Fatalf("stats: admitted +%d dialed +%d, want +2 +1", after.Admitted-before.Admitted, after.Dialed-before.Dialed)
	}
}

// (a) A TCP client that connects and never speaks, and one that sends a valid
// greeting and then stalls before READY, do not delay a DEALER.
func TestSilentClientsDoNotBlockAccept(t *testing.T) {
	g := newTestGuard(t, Options{})
	r, addr := startRouter(t, g.Scheme())
	echo(r)
	for range 3 {
		dialRaw(t, addr, "")
	}
	half := dialRaw(t, addr, "")
	mustWrite(t, half, clientGreeting())
	waitFor(t, "4 pending pre-handshakes", 2*time.Second, func() bool { return g.Stats().Pending == 4 })

	start := time.Now()
	d := dialDealer(t, "w1", "tcp://"+addr, 2*time.Second)
	rtt := roundTrip(t, d, "hello", 2*time.Second)
	elapsed := time.Since(start)
	t.Logf("connect+first round trip with 4 stalled clients pending: %v (rtt %v)", elapsed, rtt)
	if elapsed > time.Second {
		t.Fatalf("DEALER took %v with silent clients pending", elapsed)
	}
	if s := g.Stats(); s.Pending != 4 || s.Admitted != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Control for (a): zmq4's own tcp transport blocks every new connection
// behind one silent client.
func TestPlainTCPSilentClientBlocksAccept(t *testing.T) {
	r, addr := startRouter(t, "tcp")
	echo(r)
	silent := dialRaw(t, addr, "")
	time.Sleep(50 * time.Millisecond) // let zmq4's accept loop pick it up
	d := newDealer(t, "w1")
	done := make(chan error, 1)
	go func() { done <- d.Dial("tcp://" + addr) }()
	select {
	case err := <-done:
		t.Fatalf("expected zmq4 tcp accept loop to be blocked, dial returned %v", err)
	case <-time.After(time.Second):
		t.Log("plain tcp: DEALER still not connected after 1s behind one silent client (zmq4 defect a)")
	}
	_ = silent.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dial after silent client left: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("dial still blocked after the silent client closed")
	}
}

func TestBadHandshakesRejected(t *testing.T) {
	g := newTestGuard(t, Options{})
	r, addr := startRouter(t, g.Scheme())
	echo(r)
	greeting := func(mut func([]byte)) []byte { b := clientGreeting(); mut(b); return b }
	cases := []struct {
		name  string
		data  []byte
		count func(Stats) uint64
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), func(s Stats) uint64 { return s.BadSignature }},
		{"zmtp2", greeting(func(b []byte) { b[10] = 1 }), func(s Stats) uint64 { return s.BadVersion }},
		{"zmtp4", greeting(func(b []byte) { b[10] = 4 }), func(s Stats) uint64 { return s.BadVersion }},
		{"plain", greeting(func(b []byte) { copy(b[12:32], "PLAIN\x00\x00\x00\x00") }), func(s Stats) uint64 { return s.BadMechanism }},
		{"curve", greeting(func(b []byte) { copy(b[12:32], "CURVE") }), func(s Stats) uint64 { return s.BadMechanism }},
		{"server-flag", greeting(func(b []byte) { b[32] = 7 }), func(s Stats) uint64 { return s.BadServerFlag }},
		// The payload that crashes zmq4's tcp transport (see below).
		{"ready-truncated", append(clientGreeting(), zframe(flagCommand, []byte("\x05READY\x03abc"), false)...), func(s Stats) uint64 { return s.BadReady }},
		{"ready-not-command", append(clientGreeting(), zframe(0, []byte("hi"), false)...), func(s Stats) uint64 { return s.BadReady }},
		{"ready-wrong-name", append(clientGreeting(), zframe(flagCommand, []byte("\x04PING\x00\x00"), false)...), func(s Stats) uint64 { return s.BadReady }},
		{"ready-huge", append(clientGreeting(), zframe(flagCommand, make([]byte, MaxCommandSize+1), false)...), func(s Stats) uint64 { return s.BadReady }},
		{"peer-pub", append(clientGreeting(), readyCmd("Socket-Type", "PUB")...), func(s Stats) uint64 { return s.PeerTypeRejected }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.count(g.Stats())
			c := dialRaw(t, addr, "")
			mustWrite(t, c, tc.data)
			start := time.Now()
			expectClosed(t, c, 2*time.Second)
			waitFor(t, "reject counted", time.Second, func() bool { return tc.count(g.Stats()) == before+1 })
			t.Logf("dropped after %v", time.Since(start).Round(time.Millisecond))
		})
	}
	d := dialDealer(t, "after", "tcp://"+addr, 2*time.Second)
	roundTrip(t, d, "still working", 2*time.Second)
	if s := g.Stats(); s.Admitted != 1 || s.Pending != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// zmq4's own READY parser panics on a 14-byte malformed property and takes
// the whole process down (the panic is in its accept goroutine). Run in a
// child process.
func TestPlainTCPMalformedReadyCrashes(t *testing.T) {
	if os.Getenv("GUARD_CRASH_CHILD") == "1" {
		r, addr := startRouter(t, "tcp")
		_ = r
		c := dialRaw(t, addr, "")
		mustWrite(t, c, append(clientGreeting(), zframe(flagCommand, []byte("\x05READY\x03abc"), false)...))
		time.Sleep(2 * time.Second)
		return // not reached if zmq4 panicked
	}
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPlainTCPMalformedReadyCrashes$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GUARD_CRASH_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "panic") {
		t.Fatalf("expected the child to panic; err=%v output:\n%s", err, out)
	}
	t.Logf("plain tcp: one malformed READY crashed the process: %s", firstLine(string(out), "panic"))
}

func firstLine(s, prefix string) string {
	for l := range strings.Lines(s) {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// totalAlloc returns cumulative bytes allocated by the process so far.
func totalAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

const frame100MB = 100 << 20

// sendHugeHeader sends the header of a message frame declaring size bytes,
// plus 64 KiB of its body.
func sendHugeHeader(t *testing.T, c net.Conn, size uint64) {
	t.Helper()
	hdr := make([]byte, 9)
	hdr[0] = flagLong
	for i := range 8 {
		hdr[1+i] = byte(size >> (56 - 8*i))
	}
	mustWrite(t, c, hdr)
	_, _ = c.Write(make([]byte, 64<<10)) // may fail once the guard has cut us
}

// (b) A peer declaring a 100 MB frame is cut before zmq4 allocates it; the
// other peers keep working.
func TestOversizedFrameCutWithoutAllocation(t *testing.T) {
	g := newTestGuard(t, Options{})
	r, addr := startRouter(t, g.Scheme())
	echo(r)
	healthy := dialDealer(t, "healthy", "tcp://"+addr, 2*time.Second)
	roundTrip(t, healthy, "warm-up", 2*time.Second)

	for i, size := range []uint64{frame100MB, 1 << 62, DefaultMaxFrameSize + 1} {
		bad := dialRaw(t, addr, "")
		rawHandshake(t, bad, fmt.Sprintf("bad-%d", i))
		waitFor(t, "bad peer admitted", time.Second, func() bool { return g.Stats().Admitted == uint64(2+i) })
		before := totalAlloc()
		sendHugeHeader(t, bad, size)
		expectClosed(t, bad, 2*time.Second)
		waitFor(t, "oversized frame counted", time.Second, func() bool { return g.Stats().OversizedFrames == uint64(i+1) })
		delta := totalAlloc() - before
		t.Logf("declared %d bytes: cut; process allocated %d KiB meanwhile", size, delta>>10)
		if delta > 16<<20 {
			t.Fatalf("allocated %d bytes while cutting a %d-byte frame", delta, size)
		}
		roundTrip(t, healthy, fmt.Sprintf("after-%d", i), 2*time.Second)
	}
	// The limit is exact: a frame of MaxFrameSize passes.
	roundTrip(t, healthy, strings.Repeat("y", DefaultMaxFrameSize), 10*time.Second)
	if s := g.Stats(); s.Open != 1 {
		t.Fatalf("open connections = %d, want 1 (healthy)", s.Open)
	}
}

// Control for (b): zmq4's tcp transport allocates the declared size at once.
func TestPlainTCPOversizedFrameAllocates(t *testing.T) {
	r, addr := startRouter(t, "tcp")
	echo(r)
	bad := dialRaw(t, addr, "")
	rawHandshake(t, bad, "bad")
	before := totalAlloc()
	sendHugeHeader(t, bad, frame100MB)
	var delta uint64
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if delta = totalAlloc() - before; delta >= frame100MB {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("plain tcp: a 100 MB frame header made the process allocate %d MiB", delta>>20)
	if delta < frame100MB {
		t.Fatalf("expected zmq4 to allocate >= 100 MiB, saw %d bytes", delta)
	}
}

// Multipart limits: total bytes and frame count of one message.
func TestOversizedMessageCut(t *testing.T) {
	g := newTestGuard(t, Options{MaxFrameSize: 1 << 10, MaxMessageSize: 4 << 10, MaxFramesPerMessage: 8})
	r, addr := startRouter(t, g.Scheme())
	echo(r)

	c := dialRaw(t, addr, "")
	rawHandshake(t, c, "m1")
	for range 5 { // 5 KiB in 1 KiB frames > 4 KiB
		_, _ = c.Write(zframe(flagMore, make([]byte, 1<<10), false))
	}
	expectClosed(t, c, 2*time.Second)

	c2 := dialRaw(t, addr, "")
	rawHandshake(t, c2, "m2")
	for range 9 { // 9 empty frames > 8
		_, _ = c2.Write(zframe(flagMore, nil, false))
	}
	expectClosed(t, c2, 2*time.Second)
	waitFor(t, "2 oversized messages", time.Second, func() bool { return g.Stats().OversizedMessages == 2 })

	// Commands after the handshake are not delivered as messages; a PING
	// (libzmq heartbeat) is answered by the guard with a PONG.
	c3 := dialRaw(t, addr, "")
	br := rawHandshake(t, c3, "m3")
	mustWrite(t, c3, zframe(flagCommand, []byte("\x04PING\x00\x0actx1"), false))
	mustWrite(t, c3, zframe(flagCommand, []byte("\x07UNKNOWN"), false))
	mustWrite(t, c3, zframe(0, []byte("data"), false))
	_ = c3.SetReadDeadline(time.Now().Add(2 * time.Second))
	if fl, body := readFrame(t, br); fl != flagCommand || string(body) != "\x04PONGctx1" {
		t.Fatalf("got frame %#x %q, want PONG ctx1", fl, body)
	}
	if _, body := readFrame(t, br); string(body) != "data" {
		t.Fatalf("echo = %q, want data", body)
	}
	if s := g.Stats(); s.CommandsDropped != 2 || s.PingsAnswered != 1 {
		t.Fatalf("CommandsDropped = %d, PingsAnswered = %d", s.CommandsDropped, s.PingsAnswered)
	}
}

// (flood) 500 half-open connections from one address, then 500 from ten
// others: the pre-handshake stays capped and a real worker still connects.
func TestHalfOpenFloodCapped(t *testing.T) {
	const perIP, global = 16, 64
	g := newTestGuard(t, Options{MaxPending: global, MaxPendingPerIP: perIP, HandshakeTimeout: 2 * time.Second})
	r, addr := startRouter(t, g.Scheme())
	echo(r)

	var maxPending int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if p := g.Stats().Pending; p > maxPending {
				maxPending = p
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	flood := func(ip string) {
		c, err := tryDialRaw(addr, ip)
		if err == nil { // refused ones may fail with a reset
			conns = append(conns, c)
		}
	}
	for range 500 {
		flood("127.0.0.2")
	}
	waitFor(t, "500 accepted", 5*time.Second, func() bool { return g.Stats().Accepted == 500 })
	s := g.Stats()
	t.Logf("one source, 500 half-open: pending %d, refused per-IP %d", s.Pending, s.FloodRejectedPerIP)
	if s.Pending != perIP || s.FloodRejectedPerIP != 500-perIP {
		t.Fatalf("per-IP cap: %+v", s)
	}
	// A worker from another address connects at once.
	start := time.Now()
	d := dialDealer(t, "w1", "tcp://"+addr, 2*time.Second)
	roundTrip(t, d, "during flood", 2*time.Second)
	t.Logf("worker connect+round trip during the flood: %v", time.Since(start))

	for i := range 500 {
		flood(fmt.Sprintf("127.0.0.%d", 3+i/50))
	}
	waitFor(t, "1001 accepted", 5*time.Second, func() bool { return g.Stats().Accepted == 1001 })
	s = g.Stats()
	t.Logf("ten sources, 500 more: pending %d, refused global %d, per-IP %d", s.Pending, s.FloodRejected, s.FloodRejectedPerIP)
	if s.Pending != global || s.FloodRejected == 0 {
		t.Fatalf("global cap: %+v", s)
	}
	// Existing peers are unaffected.
	roundTrip(t, d, "still fine", 2*time.Second)

	// After HandshakeTimeout every half-open connection is dropped.
	waitFor(t, "pending drained", 5*time.Second, func() bool { return g.Stats().Pending == 0 })
	close(stop)
	wg.Wait()
	s = g.Stats()
	if maxPending > global || s.HandshakeTimeouts != global {
		t.Fatalf("max pending %d (cap %d), timeouts %d: %+v", maxPending, global, s.HandshakeTimeouts, s)
	}
	if got := s.FloodRejected + s.FloodRejectedPerIP + s.HandshakeTimeouts; got != 1000 {
		t.Fatalf("flood connections accounted: %d, want 1000", got)
	}
	d2 := dialDealer(t, "w2", "tcp://"+addr, 2*time.Second)
	roundTrip(t, d2, "after flood", 2*time.Second)
}

func TestDuplicateIdentityAndDisconnect(t *testing.T) {
	g := newTestGuard(t, Options{})
	r, addr := startRouter(t, g.Scheme())
	echo(r)
	old := dialRaw(t, addr, "")
	rawHandshake(t, old, "dup")
	waitFor(t, "first admitted", time.Second, func() bool { return g.Stats().Admitted == 1 })
	d := dialDealer(t, "dup", "tcp://"+addr, 2*time.Second)
	expectClosed(t, old, 2*time.Second)
	roundTrip(t, d, "new owner", 2*time.Second)
	if s := g.Stats(); s.HandedOver != 1 || s.Open != 1 {
		t.Fatalf("handover stats %+v", s)
	}
	if p := g.Peers(); len(p) != 1 || p[0] != "dup" {
		t.Fatalf("Peers() = %q", p)
	}
	if n := g.Disconnect("dup"); n != 1 {
		t.Fatalf("Disconnect = %d", n)
	}
	waitFor(t, "disconnected", time.Second, func() bool { return g.Stats().Open == 0 })
	if s := g.Stats(); s.Disconnected != 1 {
		t.Fatalf("Disconnected = %d", s.Disconnected)
	}

	gr := newTestGuard(t, Options{DuplicateIdentity: DuplicateReject})
	r2, addr2 := startRouter(t, gr.Scheme())
	echo(r2)
	first := dialDealer(t, "same", "tcp://"+addr2, 2*time.Second)
	second := dialRaw(t, addr2, "")
	g2 := clientGreeting()
	mustWrite(t, second, append(g2, readyCmd("Socket-Type", "DEALER", "Identity", "same")...))
	expectClosed(t, second, 2*time.Second)
	roundTrip(t, first, "first keeps it", 2*time.Second)
	if s := gr.Stats(); s.DuplicateRejected != 1 {
		t.Fatalf("reject stats %+v", s)
	}
}

// zmq4 neither closes nor tracks a connection whose handshake it rejects
// itself; the guard closes connections zmq4 does not adopt in time.
func TestUnadoptedConnectionClosed(t *testing.T) {
	g := newTestGuard(t, Options{HandshakeTimeout: 300 * time.Millisecond, PeerSocketTypes: []string{"DEALER", "PUB"}})
	r, addr := startRouter(t, g.Scheme())
	echo(r)
	c := dialRaw(t, addr, "")
	mustWrite(t, c, append(clientGreeting(), readyCmd("Socket-Type", "PUB")...)) // zmq4: incompatible with ROUTER
	expectClosed(t, c, 2*time.Second)
	waitFor(t, "closed and counted", time.Second, func() bool {
		s := g.Stats()
		return s.ProtocolErrors == 1 && s.Open == 0
	})
	d := dialDealer(t, "w", "tcp://"+addr, 2*time.Second)
	roundTrip(t, d, "ok", 2*time.Second)
}

// Under DuplicateDistinct two connections announcing one identity both
// stay open under routing identities of their own: a newcomer displaces
// nobody, each is addressed on its own, and Disconnect closes just one.
func TestDuplicateDistinctKeepsBothConnectionsApart(t *testing.T) {
	g := newTestGuard(t, Options{DuplicateIdentity: DuplicateDistinct})
	r, addr := startRouter(t, g.Scheme())
	first := dialDealer(t, "w1", "tcp://"+addr, 2*time.Second)
	if err := first.Send(zmq4.NewMsgString("from first")); err != nil {
		t.Fatal(err)
	}
	m1, err := recvTimeout(r, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	second := dialDealer(t, "w1", "tcp://"+addr, 2*time.Second)
	if err := second.Send(zmq4.NewMsgString("from second")); err != nil {
		t.Fatal(err)
	}
	m2, err := recvTimeout(r, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	id1, id2 := string(m1.Frames[0]), string(m2.Frames[0])
	if id1 == id2 || BaseIdentity(id1) != "w1" || BaseIdentity(id2) != "w1" {
		t.Fatalf("routing identities %q and %q: want two distinct ones with base w1", id1, id2)
	}
	if s := g.Stats(); s.HandedOver != 0 || s.Open != 2 {
		t.Fatalf("stats %+v: want both open, none handed over", s)
	}
	// Each connection gets only its own messages.
	for _, c := range []struct {
		id string
		d  zmq4.Socket
	}{{id1, first}, {id2, second}} {
		if err := r.Send(zmq4.NewMsgFrom([]byte(c.id), []byte("to "+c.id))); err != nil {
			t.Fatal(err)
		}
		got, err := recvTimeout(c.d, 2*time.Second)
		if err != nil {
			t.Fatalf("%q: %v", c.id, err)
		}
		if string(got.Frames[len(got.Frames)-1]) != "to "+c.id {
			t.Fatalf("%q received %q", c.id, got.Frames)
		}
	}
	if n := g.Disconnect(id1); n != 1 {
		t.Fatalf("Disconnect(first) = %d, want 1", n)
	}
	waitFor(t, "the first connection closed", 2*time.Second, func() bool { return g.Stats().Open == 1 })
	if p := g.Peers(); len(p) != 1 || p[0] != id2 {
		t.Fatalf("Peers() = %q, want only the second", p)
	}
	if BaseIdentity("plain") != "plain" {
		t.Fatal("BaseIdentity of an identity without separator changed it")
	}
}
