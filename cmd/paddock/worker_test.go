package main

import (
	"bytes"
	"strings"
	"testing"
)

// Worker flags that could never work are refused at start, naming the flag,
// instead of being retried forever (--connect) or silently replaced
// (--capacity).
func TestWorkerRefusesBadFlagsNamingThem(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--capacity", "0"}, "--capacity 0"},
		{[]string{"--capacity", "-3"}, "--capacity -3"},
		{[]string{"--connect", "garbage"}, `--connect "garbage": want tcp://HOST:PORT`},
		{[]string{"--connect", "tcp://localhost"}, `--connect "tcp://localhost"`},
		{[]string{"--connect", "tcp://localhost:99999"}, "not 1..65535"},
		{[]string{"--connect", "udp://127.0.0.1:7700"}, `--connect "udp://127.0.0.1:7700"`},
	} {
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"worker", "--id", "w", "--key-file", "../../examples/worker-1.key", "--pool", "p"}, c.args...))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("paddock worker %s: error %v, want one containing %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}
