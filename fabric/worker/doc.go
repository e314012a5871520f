// Package worker is a RuntimeFabric remote worker: what `paddock worker`
// runs, and what a Go program embeds to run Paddock turns on its machine
// for a host's broker (package fabric). It connects a ZeroMQ DEALER to the
// host, authenticates with its id and key, announces its pools, kinds and
// free capacity, heartbeats, reconnects after a host restart, and runs the
// turns it is sent: wasm modules (fetched from the host by digest and
// cached) and the plugin workers of its own machine.
//
//	key, err := wire.ParseKey(text) // the key listed in the host's fabric.workers
//	err = worker.Run(ctx, worker.Config{Connect: "tcp://host:7700",
//		ID: "w1", Key: key, Pools: []string{"gpu"}, Capacity: 4, CacheDir: dir}, logger)
//
// The wire protocol is abi/FABRIC.md (its Go codec is fabric/wire); a
// worker in another language implements that document instead of
// importing this package. The host side — the broker, the guard
// transport — is package fabric and fabric/guard; a worker binary does
// not link them.
package worker
