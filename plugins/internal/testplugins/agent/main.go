// Command agent is a test plugin that misbehaves on request. Each message
// is one command:
//
//	echo <text>     answers "echo: <text>"
//	traceparent     answers the W3C traceparent of the turn's ctx, or "none"
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
//	call <url>      makes an http host call GET <url> (abi.CallHTTP) and
//	                answers "<status> <body>", or "error <code>: <message>"
//	calllen <url>   the same, answering "<status> len <body length>"
//	callmodel <ep>  makes a model host call (plugins.Model) to endpoint ep
//	                and answers the reply's content, or "error <code>: …"
//	callloop <n> <url>  makes n http host calls one after the other and
//	                answers "<n> calls"
//	callafter <url> answers at once, then calls <url> in the background
//	                after the turn ended and logs the outcome
//	                ("late call: error cancelled")
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
	"github.com/paddock-dev/paddock/tracing"
)

func main() { plugins.Serve(turn) }

func reply(s string) *abi.TurnResult {
	return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: s}}}
}

// callError renders a host call's error for a reply.
func callError(err error) string {
	var ce *abi.CallError
	if errors.As(err, &ce) {
		return fmt.Sprintf("error %s: %s", ce.Code, ce.Message)
	}
	return fmt.Sprint("error ", err)
}

func turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	verb, arg, _ := strings.Cut(strings.TrimSpace(req.Event.Message), " ")
	ms, _ := strconv.Atoi(arg)
	switch verb {
	case "echo":
		return reply("echo: " + arg), nil
	case "traceparent":
		if tp := tracing.Traceparent(ctx); tp != "" {
			return reply(tp), nil
		}
		return reply("none"), nil
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
	case "call", "calllen":
		resp, err := abi.CallHTTP(ctx, &abi.HTTPRequest{URL: arg})
		if err != nil {
			return reply(callError(err)), nil
		}
		if verb == "calllen" {
			return reply(fmt.Sprintf("%d len %d", resp.Status, len(resp.Body))), nil
		}
		return reply(fmt.Sprintf("%d %s", resp.Status, resp.Body)), nil
	case "callmodel":
		resp, err := plugins.Model(ctx, &abi.ModelRequest{Endpoint: arg,
			Messages: []abi.ModelMessage{{Role: abi.RoleUser, Content: "hello"}}})
		if err != nil {
			return reply(callError(err)), nil
		}
		return reply(resp.Message.Content), nil
	case "callloop":
		n, url, _ := strings.Cut(arg, " ")
		count, _ := strconv.Atoi(n)
		for i := range count {
			if _, err := abi.CallHTTP(ctx, &abi.HTTPRequest{URL: url}); err != nil {
				return reply(fmt.Sprintf("call %d: %s", i, callError(err))), nil
			}
		}
		return reply(fmt.Sprintf("%d calls", count)), nil
	case "callafter":
		go func() {
			time.Sleep(100 * time.Millisecond)
			_, err := plugins.HTTP(ctx, &abi.HTTPRequest{URL: arg})
			plugins.Logger(ctx).Info("late call: " + callError(err))
		}()
		return reply("answered"), nil
	}
	return reply("ok: " + req.Event.Message), nil
}
