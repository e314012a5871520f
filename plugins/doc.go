// Package plugins is the plugin SDK: what an agent author imports to run
// an agent out of process as a plugin worker, served to the Paddock host
// through hashicorp/go-plugin over gRPC (docs/DESIGN.md "Workers"). The host side —
// starting, supervising and talking to plugin processes — is package
// plugins/pluginhost; a plugin binary does not link it.
//
// # Writing a plugin
//
// An agent author writes the same abi.TurnFunc as for a wasm guest and
// serves it from main:
//
//	package main
//
//	import "github.com/paddock-dev/paddock/plugins"
//
//	func main() { plugins.Serve(myTurn) }
//
// built with a plain `go build`. Serve runs each turn through abi.Run (so
// errors, nil results and panics become error outcomes and the turn_ref is
// echoed), runs turns concurrently (one process may serve several
// sessions), relays steers to PollSteer and cancellation to the TurnFunc's
// ctx, logs hclog JSON to stderr (Logger, tagged with the turn_ref), and
// exits when the host closes it or the host process dies.
//
// The host checks the binary's sha256 before every start, gives the
// process only the environment registered with it (the variable
// PADDOCK_PLUGIN_LOG_LEVEL sets Logger's level), replaces a process that
// crashes, hangs or breaks the protocol, and fails the turns it was
// running; see plugins/pluginhost.
//
// # The protocol, for plugins in other languages
//
// go-plugin's gRPC protocol with the handshake ProtocolVersion = abi.Version
// (1), MagicCookieKey PADDOCK_PLUGIN_COOKIE, MagicCookieValue
// 3d0c7a5e-paddock-turn-worker, and AutoMTLS. The plugin serves the
// service paddock.plugin.v1.TurnWorker with one bidirectional-streaming
// method Turn, whose messages in both directions are
// google.protobuf.BytesValue; each value is a JSON frame
// {"type": ..., "body": ...} whose body is abi v1 JSON (abi/README.md).
// One stream is one turn:
//
//	host → plugin   {"type":"request","body":TurnRequest,"calls":true}   first, once
//	plugin → host   {"type":"accepted"}                      at once: the turn is taken in
//	host → plugin   {"type":"steer","body":Steer}            any number, while the turn runs
//	plugin → host   {"type":"steer_taken","body":TurnRef}    when the turn takes a steer in
//	plugin → host   {"type":"call","body":{"id":N,"request":CallRequest}}      a host call
//	host → plugin   {"type":"call_result","body":{"id":N,"result":CallResult}} its answer
//	host → plugin   {"type":"cancel"}                        the turn must stop (cancel or deadline)
//	plugin → host   {"type":"result","body":TurnResult}      last; then the plugin ends the stream
//
// The result must echo the request's turn_ref or that of a steer the
// plugin announced with steer_taken; receivers ignore frame types they do
// not know. The host half-closes its side after a cancel and cancels the
// stream (gRPC cancellation) after its cancel grace
// (pluginhost.Options.CancelGrace); frames are at most 9 MiB.
//
// When the turn is traced, the stream's gRPC metadata carries the W3C
// "traceparent" of the host's attempt span; Serve makes it the remote
// parent span context of the TurnFunc's ctx, so that spans a plugin starts
// with OpenTelemetry join the signal's trace (docs/DESIGN.md "Tracing").
//
// # Host calls
//
// A turn reaches the outside world only through host calls (abi.CallHTTP,
// abi.CallModel, or their equals HTTP and Model): Serve gives the
// TurnFunc's ctx an abi.Caller that sends each call as a call frame on the
// turn's own stream, numbered by the plugin (id ≥ 1), and waits for the
// call_result with that id. The host answers it through the abi.Caller of
// the ctx its Instance.Turn runs under, so a call can only ever reach the
// turn that made it, also when several turns share the process. A call
// whose turn was cancelled, timed out or ended returns the error
// "cancelled" at once on the plugin side, and the host's call is cancelled
// with the turn's ctx. A turn has at most 16 calls in flight (the SDK makes
// more wait; the host answers an excess call "denied"); a request is at
// most abi.MaxCallRequestBytes, a result abi.MaxCallResultBytes. The
// request frame's "calls": true says the host answers calls: without it
// (an older host) every call returns "not_configured" at once.
//
// Streamed output (abi.Emit, abi.EmitJSON: a CallRequest of kind "emit",
// abi/README.md "Emit") is a host call like any: a call frame and its
// call_result, answered as soon as the host has buffered the chunk. Its
// chunks keep the order in which the host receives them, so a turn that
// emits from several goroutines orders them itself.
package plugins
