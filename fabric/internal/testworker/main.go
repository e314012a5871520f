// Command testworker runs worker.Run (fabric/worker) from environment variables, for
// tests that need a worker in a process of its own (kill -9):
//
//	FABRIC_CONNECT, FABRIC_ID, FABRIC_KEY (hex), FABRIC_POOL,
//	FABRIC_CAPACITY, FABRIC_CACHE_DIR, FABRIC_WASM_CACHE_DIR
//
// It logs to stderr and exits when it receives SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/wasm"
)

func main() {
	key, err := wire.ParseKey(os.Getenv("FABRIC_KEY"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	capacity, _ := strconv.Atoi(os.Getenv("FABRIC_CAPACITY"))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err = worker.Run(ctx, worker.Config{
		Connect: os.Getenv("FABRIC_CONNECT"), ID: os.Getenv("FABRIC_ID"), Key: key,
		Pools: []string{os.Getenv("FABRIC_POOL")}, Capacity: capacity, CacheDir: os.Getenv("FABRIC_CACHE_DIR"),
		Wasm:         wasm.Config{CacheDir: os.Getenv("FABRIC_WASM_CACHE_DIR"), TurnTimeout: time.Minute},
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
	}, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
