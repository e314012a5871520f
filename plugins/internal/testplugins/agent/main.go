// Command agent is a test plugin that misbehaves on request. Each message
// is one command:
//
//	echo <text>     answers "echo: <text>"
//	pid             answers the process id
//	env <NAME>      answers "<NAME>=<value>" or "<NAME> unset"
//	hang            blocks forever, ignoring cancellation
//	sleep <ms>      waits ms milliseconds or until cancelled ("slept" / error)
//	think <ms>      waits up to ms, polling for steers every 5 ms; a steer
//	                ends it with "steered: <message>"
//	crash           panics in a goroutine (the process dies)
//	exit            os.Exit(3)
//	log <text>      logs text through plugins.Logger and to stderr, answers "logged"
//	big             answers abi.MaxResultBytes+1 bytes
//	state <n>       keeps a state of n bytes (faulty.StateOf), answers "state <n>"
//	statesum        answers faulty.StateSum of the state it received
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/faulty"
	"github.com/paddock-dev/paddock/plugins"
)

func main() { plugins.Serve(turn) }

func reply(s string) *abi.TurnResult {
	return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: s}}}
}

func turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	verb, arg, _ := strings.Cut(strings.TrimSpace(req.Event.Message), " ")
	ms, _ := strconv.Atoi(arg)
	switch verb {
	case "echo":
		return reply("echo: " + arg), nil
	case "pid":
		return reply(strconv.Itoa(os.Getpid())), nil
	case "env":
		if v, ok := os.LookupEnv(arg); ok {
			return reply(arg + "=" + v), nil
		}
		return reply(arg + " unset"), nil
	case "hang":
		select {}
	case "sleep":
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return reply("slept"), nil
		case <-ctx.Done():
			return nil, fmt.Errorf("sleep interrupted: %w", ctx.Err())
		}
	case "think":
		end := time.Now().Add(time.Duration(ms) * time.Millisecond)
		for time.Now().Before(end) {
			if st, ok := plugins.PollSteer(ctx); ok {
				return reply("steered: " + st.Message), nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			time.Sleep(5 * time.Millisecond)
		}
		return reply(fmt.Sprintf("thought for %d ms", ms)), nil
	case "crash":
		go panic(errors.New("agent: crash requested"))
		select {}
	case "exit":
		os.Exit(3)
	case "log":
		plugins.Logger(ctx).Info("agent log", "text", arg)
		fmt.Fprintln(os.Stderr, "agent stderr: "+arg)
		return reply("logged"), nil
	case "big":
		return reply(strings.Repeat("x", abi.MaxResultBytes+1)), nil
	case "state":
		res := reply("state " + arg)
		res.State = faulty.StateOf(ms)
		return res, nil
	case "statesum":
		return reply(faulty.StateSum(req.State)), nil
	}
	return reply("ok: " + req.Event.Message), nil
}
