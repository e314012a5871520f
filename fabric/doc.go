// Package fabric is the host side of Paddock's RuntimeFabric: turns run on
// remote worker processes over ZeroMQ (github.com/go-zeromq/zmq4 v0.17).
// The host binds a ROUTER (Broker); workers (package fabric/worker, what
// `paddock worker` runs) connect a DEALER, authenticate, announce pools,
// kinds and capacity, heartbeat, and take turns. The wire protocol is
// fabric/wire, documented for implementers in abi/FABRIC.md; the guard
// transport the production host binds through is fabric/guard.
//
// The transport carries ids and fences, not truth (docs/DESIGN.md "Workers"): a
// lost or late message can cost time, never correctness. Every result
// echoes its turn_ref and the store's fences decide; a reply that arrives
// for no waiting turn goes to BrokerConfig.LateResult for the fences to
// reject and count.
//
//	b, err := fabric.NewBroker(ctx, fabric.BrokerConfig{
//		Endpoint: "tcp://0.0.0.0:7700", Workers: map[string][]byte{"w1": key},
//		Modules: loadModule, LateResult: submitToFences,
//	}, logger)
//	inst, err := b.Instance("gpu", binding)          // binding: module digest or plugin:<name>@<sha>
//	res, err := inst.Turn(abi.WithCaller(abi.WithSteers(ctx, steers), caller), req)
//	// the worker's host calls (CALL) are answered through caller, under ctx
//	// err: *TurnError; TurnSent() false = never accepted, retry without an attempt
//
// # Why application-level authentication
//
// zmq4's PLAIN mechanism accepts any password and it has no CURVE, so the
// fabric authenticates every message itself: each worker has a 32-byte
// key; every message is sealed with AES-256-GCM under a per-session key
// (HKDF of the worker key, the worker's incarnation id and a session id
// the host picks), with the header and the worker identity as associated
// data and a per-session, per-direction sequence number as nonce. So a
// message cannot be forged, moved to another worker or session, or
// replayed (the receiver accepts only increasing sequence numbers), and
// an incarnation is admitted only after it answered the host's fresh
// session id — a replayed HELLO can never displace a live worker. It is
// the smallest design that closes the gap without a custom transport
// (which only Go peers could speak); the guard transport (fabric/guard)
// adds robustness, not authentication. Bodies are encrypted as well as
// authenticated: requests carry session state and messages.
//
// # The send lock
//
// zmq4's ROUTER writes under one socket-wide mutex with no deadline
// (WithTimeout does not cover the write), so a peer that stops reading
// stalls every send once its TCP buffers are full. The broker works
// around it in three layers:
//
//   - Flow control: at most WindowBytes (256 KiB) sent and not yet
//     acknowledged per worker (one larger message may go when nothing is
//     outstanding). A worker that stops reading fills its window, not the
//     socket; a window blocked for HeartbeatTimeout, or a PING unanswered
//     as long, cuts the worker off. TestSlowReaderIsCutOffWithoutStallingOthers.
//   - One sender goroutine, per-worker bounded queues (QueueLen) with a
//     deadline (SendTimeout), and a watchdog: a socket send that takes
//     longer than SendTimeout marks its worker lost (send_stalled, its
//     turns fail at once) and makes every later send fail fast with
//     ErrSendStalled instead of queueing behind it.
//   - What remains (plain tcp://): the stuck write itself ends only when
//     its connection breaks. One message larger than the peer's kernel
//     buffers, or a keyless client squatting a live worker's identity
//     (zmq4 sends to every connection of an identity), can hold the lock;
//     meanwhile nothing can be sent (turns fail fast, not sent; workers
//     see no PING and reconnect). TestGapIdentitySquatterStallsPlainTCP
//     pins it. Bind through the guard transport (fabric/guard) as
//     paddock serve does: its per-write deadline bounds the stall, its
//     DuplicateDistinct policy gives every connection its own routing
//     identity (a squatter receives nothing and displaces nobody; the
//     broker maps identities back with guard.BaseIdentity), and the
//     broker cuts a peer it gave up on through BrokerConfig.Disconnect.
//
// Other library gaps, and where they are handled: no heartbeats (the
// fabric's HEARTBEAT/PING/PONG), sends to a gone identity silently dropped
// (the broker sends only inside its live set, and a turn needs ACCEPTED
// within AcceptTimeout), no maximum message size (the broker drops
// messages over MaxMessageBytes, but only after zmq4 allocated them — the
// guard refuses them before), the ZMTP handshake in the accept loop (the
// guard). See abi/FABRIC.md, "Security and limits: library gaps".
package fabric
