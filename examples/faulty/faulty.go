// Package faulty is the logic of the faulty example agent, which misbehaves
// on request so that hosts can test how they survive failed turns. Each
// message is one command:
//
//	trap          a real wasm trap (an out-of-bounds memory access)
//	crash         an unrecovered panic in a goroutine (the Go runtime exits with code 2)
//	exit [code]   os.Exit(code), code 3 by default
//	panic         a panic in the turn function, recovered by the SDK: an error outcome
//	loop          an infinite loop (the host's turn timeout ends it)
//	error         an error outcome
//	oom           allocates until the memory cap is hit
//	big [bytes]   a reply of that many bytes (default abi.MaxResultBytes+1)
//	bigstate      a state over abi.MaxStateBytes (an invalid result)
//	state <n>     a state of n bytes (StateOf(n)), answering "state <n>"
//	statesum      answers "state <len> <sha256 hex>" of the state it received
//	sleep <ms>    busy-waits ms milliseconds of wall time, then answers
//	nap <ms>      time.Sleep(ms), then answers
//	think <ms>    busy-waits ms milliseconds, polling for steers every ~10 ms:
//	              a steer ends it at once with "steered: <steer message>"
//	              (the SDK then echoes the steer's turn_ref), otherwise it
//	              answers "thought for <ms> ms"
//	flaky <n>     an error outcome on attempts < n, success from attempt n on
//	log <text>    logs text through the host import and prints it to stdout and stderr
//	anything else answers "ok: <message>"
//
// Successful replies are one "assistant" message; the state is never changed
// (nil: keep). The misbehaviours that end the module are injected through
// Agent so that the logic tests on the host.
package faulty

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/guest"
)

// Agent is the faulty agent. The function fields perform the misbehaviours
// that end the module; New fills them with the real ones.
type Agent struct {
	// Trap executes a wasm trap (on other platforms it panics).
	Trap func()
	// Crash panics in a new goroutine and never returns.
	Crash func()
	// Exit ends the process with code.
	Exit func(code int)
	// Loop never returns.
	Loop func()
	// OOM allocates until the process dies.
	OOM func()
	// PollSteer takes in the next steer of the running turn, if any
	// (guest.PollSteer, which also makes the result echo the steer's
	// turn_ref).
	PollSteer func() (abi.Steer, bool)
}

// New returns the agent with the real misbehaviours and steer poll.
func New() *Agent {
	return &Agent{Trap: trap, Crash: crash, Exit: os.Exit, Loop: spin, OOM: hog, PollSteer: guest.PollSteer}
}

// thinkPoll is how often think polls for steers.
const thinkPoll = 10 * time.Millisecond

// ErrRequested is the error of the "error" and "flaky" commands.
var ErrRequested = errors.New("faulty: error requested")

// Turn is the agent's abi.TurnFunc.
func (a *Agent) Turn(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	msg := strings.TrimSpace(req.Event.Message)
	verb, arg, _ := strings.Cut(msg, " ")
	arg = strings.TrimSpace(arg)
	reply := "ok: " + msg
	switch verb {
	case "trap":
		a.Trap()
	case "crash":
		a.Crash()
	case "exit":
		a.Exit(intArg(arg, 3))
	case "panic":
		panic("faulty: panic requested")
	case "loop":
		a.Loop()
	case "oom":
		a.OOM()
	case "error":
		return nil, ErrRequested
	case "big":
		n := intArg(arg, abi.MaxResultBytes+1)
		return reply1(strings.Repeat("x", n)), nil
	case "bigstate":
		res := reply1(reply)
		res.State = make([]byte, abi.MaxStateBytes+1)
		return res, nil
	case "state":
		res := reply1("state " + arg)
		res.State = StateOf(intArg(arg, 0))
		return res, nil
	case "statesum":
		return reply1(StateSum(req.State)), nil
	case "sleep":
		d := time.Duration(intArg(arg, 0)) * time.Millisecond
		for start := time.Now(); time.Since(start) < d; {
		}
		reply = fmt.Sprintf("slept %d ms", d.Milliseconds())
	case "think":
		d := time.Duration(intArg(arg, 0)) * time.Millisecond
		if s, ok := a.think(d); ok {
			return reply1("steered: " + s.Message), nil
		}
		reply = fmt.Sprintf("thought for %d ms", d.Milliseconds())
	case "nap":
		d := time.Duration(intArg(arg, 0)) * time.Millisecond
		time.Sleep(d)
		reply = fmt.Sprintf("napped %d ms", d.Milliseconds())
	case "flaky":
		if n := intArg(arg, 1); req.Attempt < n {
			return nil, fmt.Errorf("%w: attempt %d < %d", ErrRequested, req.Attempt, n)
		}
		reply = fmt.Sprintf("ok on attempt %d", req.Attempt)
	case "log":
		guest.Log(guest.LevelInfo, arg)
		fmt.Fprintln(os.Stdout, "stdout: "+arg)
		fmt.Fprintln(os.Stderr, "stderr: "+arg)
	}
	return reply1(reply), nil
}

// think busy-waits d of wall time, polling for a steer every thinkPoll;
// it returns early with the first steer.
func (a *Agent) think(d time.Duration) (abi.Steer, bool) {
	start := time.Now()
	for next := start; ; {
		if now := time.Now(); !now.Before(next) {
			if a.PollSteer != nil {
				if s, ok := a.PollSteer(); ok {
					return s, true
				}
			}
			next = now.Add(thinkPoll)
		}
		if time.Since(start) >= d {
			return abi.Steer{}, false
		}
	}
}

func reply1(content string) *abi.TurnResult {
	return &abi.TurnResult{
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: content}},
		Outcome:  abi.OutcomeOK,
	}
}

// intArg parses s as an int, or returns def.
// StateOf returns the n-byte state of the "state <n>" command: a
// repeating pattern of all 256 byte values, so that a truncation, a shift
// or an encoding slip shows in its checksum.
func StateOf(n int) []byte {
	b := make([]byte, max(n, 0))
	for i := range b {
		b[i] = byte(i*7 + i/256)
	}
	return b
}

// StateSum is the "statesum" command's reply for state: its length and
// SHA-256.
func StateSum(state []byte) string {
	sum := sha256.Sum256(state)
	return fmt.Sprintf("state %d %s", len(state), hex.EncodeToString(sum[:]))
}

func intArg(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	return def
}

// crash panics in a goroutine, which no recover in the turn can catch: the
// Go runtime prints the panic to stderr and exits with code 2.
func crash() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		panic("faulty: crash requested")
	}()
	<-done
}

// spin loops forever.
func spin() {
	//lint:ignore SA5002 spinning is the misbehaviour asked for: the host's turn deadline must stop it
	for {
	}
}

// hog allocates 1 MiB blocks and keeps them until the allocator fails.
func hog() {
	var kept [][]byte
	for i := 0; ; i++ {
		b := make([]byte, 1<<20)
		b[i%len(b)] = 1
		//lint:ignore SA4010 kept holds every block so that memory runs out
		kept = append(kept, b)
	}
}
