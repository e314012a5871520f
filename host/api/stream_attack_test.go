package api_test

// Attacks on the stream route (branch breaker): hostile and clumsy
// clients. Each test states what it tries and what the server must do.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	goruntime "runtime"
	"strings"
	"testing"
	"time"
)

// waitZero polls f until it returns 0, failing after 10 s.
func waitZero(t *testing.T, what string, f func() int) {
	t.Helper()
	for i := 0; f() != 0; i++ {
		if i > 1000 {
			t.Fatalf("%s = %d, want 0", what, f())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAttackConnectDisconnectCyclesLeakNothing: hundreds of clients that
// connect with every kind of position (valid, past the head, chunk ids
// past a frame's last chunk, garbage) and drop the connection at once, or
// after the first bytes, leave no subscription, watched session or
// goroutine behind.
func TestAttackConnectDisconnectCyclesLeakNothing(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, "sqlite", "")
	key := e.w.Session()
	tr := e.w.Start(key, "hi")
	tr.Emit("a", "b")
	tr.Commit("ab") // frames 1–3
	base := goruntime.NumGoroutine()
	path := "/v1/agents/notes/sessions/" + key.SessionID + "/stream"
	ids := []string{"", "0", "1", "2.0", "2.1", "2.999", "3", "99", "99.5", "head", "-1", "1.-1", "1.2.3", "head.1",
		"99999999999999999999", strings.Repeat("9", 4000)}
	for i := range 300 {
		id := ids[i%len(ids)]
		req, _ := http.NewRequest("GET", e.url+path, nil)
		req.Header.Set("Last-Event-ID", id)
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			cancel()
			t.Fatalf("Last-Event-ID %.20q: %v", id, err)
		}
		if i%2 == 0 {
			_, _ = bufio.NewReader(resp.Body).ReadString('\n')
		}
		cancel()
		resp.Body.Close()
	}
	waitZero(t, "subscribers", e.hub.Subscribers)
	waitZero(t, "watched sessions", e.hub.Watched)
	http.DefaultClient.CloseIdleConnections()
	waitZero(t, "goroutines over the baseline (+10)", func() int { return max(goruntime.NumGoroutine()-base-10, 0) })
}

// TestAttackAClientThatNeverReadsSlowsNobody: a client that opens the
// stream and never reads its socket while a turn streams megabytes does
// not hold up the turn's writes nor another client, which gets every
// event; when it goes away, its subscription ends.
func TestAttackAClientThatNeverReadsSlowsNobody(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, "sqlite", "")
	key := e.w.Session()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/agents/notes/sessions/%s/stream HTTP/1.1\r\nHost: x\r\n\r\n", key.SessionID)
	for e.hub.Subscribers() != 1 {
		time.Sleep(5 * time.Millisecond)
	}
	live := e.open(key, "")
	tr := e.w.Start(key, "hi")
	big := strings.Repeat("x", 60<<10)
	const frames = 24 // 12 × 8 × 60 KiB ≈ 5.6 MiB: more than the cache holds
	for range frames {
		tr.Emit(big, big, big, big, big, big, big, big)
	}
	tr.Commit("done")
	got := read(t, live, 1+frames*8+1)
	if last := got[len(got)-1]; last.Event != "turn.committed" {
		t.Fatalf("last event %s, want turn.committed", last.Event)
	}
	if e.hub.Subscribers() != 2 {
		t.Fatalf("subscribers = %d, want the stuck one and the live one", e.hub.Subscribers())
	}
	conn.Close()
	live.Close()
	waitZero(t, "subscribers", e.hub.Subscribers)
}
