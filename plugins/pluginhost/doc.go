// Package pluginhost is the host side of Paddock's plugin workers: it
// starts, supervises and talks to the processes that agent authors build
// with the plugin SDK (package plugins, plugins.Serve), through
// hashicorp/go-plugin over gRPC (docs/DESIGN.md "Workers"). `paddock serve`
// (host/runner) and `paddock worker` use it; an agent author does not
// import it.
//
//	m := pluginhost.NewManager(logger, pluginhost.Options{})
//	err := m.Register(ctx, pluginhost.Config{Name: "notes", Path: "bin/notes-plugin", SHA256: sum})
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
// logged through plugins.Logger); failed turns are logged with their
// turn_ref.
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
// The protocol between the Manager and a plugin process is described in
// the package doc of plugins, "The protocol, for plugins in other
// languages"; its Go code is plugins/internal/wire.
package pluginhost
