//go:build wasip1

// Command hostile is an agent module that attacks its sandbox, for the
// host's hostile-module suite (host/hostile_test.go). Each message is one
// attack:
//
//	membomb     one allocation of 1 GiB, far past the memory cap
//	grow        allocates 1 MiB blocks, keeping them, until memory.grow is refused
//	loop        spins forever
//	recurse     unbounded recursion
//	huge        a reply of 1 MiB, far over the result limit (64 KiB in the suite)
//	files PATH  tries to read PATH, /etc/passwd and /proc/self/environ, list /
//	            and ., create a file, and open files by raw WASI calls
//	socket ADDR tries to dial ADDR, listen, and accept or read on raw fds
//	env         reads the environment and the arguments
//	nul         an error outcome whose text holds a NUL character
//	binary      writes bytes that are not UTF-8 (and a NUL) to stderr, then crashes
//
// The last three never fail by themselves: they answer an error outcome
// (a failed attempt) whose text reports everything they got back, so the
// test can check that nothing of the host reached the guest.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared ./host/testdata/hostile
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"unsafe"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/guest"
)

func init() { guest.Handle(turn) }

func main() {}

// kept makes allocations reachable so the collector cannot free them.
var kept [][]byte

func turn(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	verb, arg, _ := strings.Cut(strings.TrimSpace(req.Event.Message), " ")
	switch verb {
	case "membomb":
		b := make([]byte, 1<<30)
		b[len(b)-1] = 1
		kept = append(kept, b)
	case "grow":
		for i := 0; ; i++ {
			b := make([]byte, 1<<20)
			b[i%len(b)] = 1
			kept = append(kept, b)
		}
	case "loop":
		for {
		}
	case "recurse":
		return reply(fmt.Sprint(recurse(1))), nil
	case "huge":
		return reply(strings.Repeat("x", 1<<20)), nil
	case "files":
		return nil, errors.New(files(arg))
	case "socket":
		return nil, errors.New(socket(arg))
	case "nul":
		return nil, errors.New("nul \x00 here")
	case "binary":
		os.Stderr.Write([]byte("garbage \xff\xfe\x00\xc3 on stderr\n"))
		done := make(chan struct{})
		go func() {
			defer close(done)
			panic("hostile: crash after binary stderr")
		}()
		<-done
	case "env":
		return nil, fmt.Errorf("environ=%q args=%q PATH=%q HOME=%q", os.Environ(), os.Args, os.Getenv("PATH"), os.Getenv("HOME"))
	}
	return reply("ok: " + req.Event.Message), nil
}

func reply(s string) *abi.TurnResult {
	return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: s}}}
}

// recurse never returns; the frame is padded so that the stack grows fast.
//
//go:noinline
func recurse(n int) int {
	var pad [256]byte
	pad[n%len(pad)] = byte(n)
	return recurse(n+1) + int(pad[(n+1)%len(pad)])
}

// files reports what each file-system attempt got back.
func files(path string) string {
	var out []string
	report := func(what string, b []byte, err error) {
		out = append(out, fmt.Sprintf("%s: %d bytes %q, err=%v", what, len(b), b, err))
	}
	for _, p := range []string{path, "/etc/passwd", "/proc/self/environ", "../../../../etc/hostname"} {
		b, err := os.ReadFile(p)
		report("read "+p, b, err)
	}
	for _, d := range []string{"/", ".", "/tmp"} {
		es, err := os.ReadDir(d)
		names := make([]string, 0, len(es))
		for _, e := range es {
			names = append(names, e.Name())
		}
		report("list "+d, []byte(strings.Join(names, ",")), err)
	}
	f, err := os.Create("/tmp/paddock-hostile")
	if err == nil {
		f.Close()
	}
	report("create /tmp/paddock-hostile", nil, err)
	// Raw WASI: the preopened directories a sandbox would grant start at
	// fd 3; path_open relative to each.
	name := "etc/passwd"
	for fd := int32(3); fd < 8; fd++ {
		var opened int32
		errno := pathOpen(fd, 0, unsafe.Pointer(unsafe.StringData(name)), uint32(len(name)), 0, 1<<1, 1<<1, 0, unsafe.Pointer(&opened))
		out = append(out, fmt.Sprintf("path_open(%d, %s): errno %d", fd, name, errno))
		var buf [64]byte
		var n uint32
		iov := [2]uint32{uint32(uintptr(unsafe.Pointer(&buf[0]))), uint32(len(buf))}
		errno = fdRead(fd, unsafe.Pointer(&iov), 1, unsafe.Pointer(&n))
		out = append(out, fmt.Sprintf("fd_read(%d): errno %d, %d bytes", fd, errno, n))
	}
	return "files: " + strings.Join(out, "; ")
}

// socket reports what each network attempt got back.
func socket(addr string) string {
	var out []string
	c, err := net.Dial("tcp", addr)
	if err == nil {
		_, err = c.Write([]byte("hostile\n"))
		c.Close()
		out = append(out, fmt.Sprintf("dial %s: CONNECTED (write err=%v)", addr, err))
	} else {
		out = append(out, fmt.Sprintf("dial %s: %v", addr, err))
	}
	l, err := net.Listen("tcp", "0.0.0.0:8080")
	if err == nil {
		out = append(out, fmt.Sprintf("listen: %s (in-process only)", l.Addr()))
		l.Close()
	} else {
		out = append(out, fmt.Sprintf("listen: %v", err))
	}
	// Raw WASI: preopened sockets would be fds from 3 on.
	for fd := int32(0); fd < 8; fd++ {
		var conn int32
		errno := sockAccept(fd, 0, unsafe.Pointer(&conn))
		out = append(out, fmt.Sprintf("sock_accept(%d): errno %d", fd, errno))
	}
	return "socket: " + strings.Join(out, "; ")
}

//go:wasmimport wasi_snapshot_preview1 path_open
//go:noescape
func pathOpen(fd int32, dirflags uint32, path unsafe.Pointer, pathLen uint32, oflags uint32, rightsBase uint64, rightsInheriting uint64, fdflags uint32, result unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_read
//go:noescape
func fdRead(fd int32, iovs unsafe.Pointer, iovsLen uint32, nread unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 sock_accept
//go:noescape
func sockAccept(fd int32, flags uint32, result unsafe.Pointer) int32
