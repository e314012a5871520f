// Package plugins runs Paddock agents out of process as plugin workers,
// through hashicorp/go-plugin over gRPC (DESIGN "Workers"). It has two
// sides.
//
// # Plugin side: the SDK
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
// # Host side: the Manager
//
//	m := plugins.NewManager(logger, plugins.Options{})
//	err := m.Register(ctx, plugins.Config{Name: "notes", Path: "bin/notes-plugin", SHA256: sum})
//	inst, err := m.Instance(ctx, "notes", sum)
//	res, err := inst.Turn(abi.WithSteers(ctx, steers), req)
//	...
//	m.Close(ctx)
//
// Register checks the binary (exists, executable, sha256) and starts one
// process to verify the handshake and ABI version, so a bad plugin is
// refused at registration with a *ConfigError. Every process start uses
// go-plugin's SecureConfig (the sha256 is checked before each exec),
// AutoMTLS, SkipHostEnv (the plugin gets only Config.Env), gRPC only,
// Options.StartTimeout, and Managed false: the Manager owns the
// processes. Turns run on the least loaded of up to Config.Processes
// processes per plugin, started on demand; a process that exits, crashes,
// stops answering health checks, breaks the protocol, or does not stop a
// cancelled turn within Options.CancelGrace is replaced, and its turns
// fail with a *TurnError saying why. Too many failures in a window
// (Options.MaxRestarts in RestartWindow) stop restarts for
// RestartCooldown. Plugin stderr and hclog lines go to the Manager's
// slog logger tagged with worker=<name> (and turn_ref when the plugin
// logged through Logger); failed turns are logged with their turn_ref.
//
// Plugin processes never outlive the host: Close kills them; on Linux they
// are started with a parent-death signal (SIGKILL), and the SDK also exits
// within ~200 ms when its parent process changes.
//
// A binding — what an agent runs, recorded on each delivery — is
// "plugin:<name>@<sha256>" (Binding, ParseBinding): a retry runs only if
// the registered binary still has that checksum (ErrBindingChanged
// otherwise).
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
//	host → plugin   {"type":"request","body":TurnRequest}   first, once
//	plugin → host   {"type":"accepted"}                      at once: the turn is taken in
//	host → plugin   {"type":"steer","body":Steer}            any number, while the turn runs
//	plugin → host   {"type":"steer_taken","body":TurnRef}    when the turn takes a steer in
//	host → plugin   {"type":"cancel"}                        the turn must stop (cancel or deadline)
//	plugin → host   {"type":"result","body":TurnResult}      last; then the plugin ends the stream
//
// The result must echo the request's turn_ref or that of a steer the
// plugin announced with steer_taken; receivers ignore frame types they do
// not know. The host half-closes its side after a cancel and cancels the
// stream (gRPC cancellation) after Options.CancelGrace; frames are at most
// 8 MiB.
package plugins
