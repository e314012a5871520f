package main

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// Fence rejections are counted two ways.
//
// The metric paddock_fence_rejections_total{reason} lives in a host's
// memory: the scraper reads every live host's /metrics each second and keeps
// the last value per host incarnation; a killed incarnation's rejections
// after its last scrape are lost, so the sum is a lower bound.
//
// Every rejection is also logged by the host as it is counted ("reply
// rejected by fence" for a worker's reply, "failed attempt fenced off" for
// a failure report, each with reason=…); the logs survive kill -9, so
// counting those lines is complete. The report gives both.

var fenceMetricRE = regexp.MustCompile(`^paddock_fence_rejections_total\{reason="([a-z_]+)"\} ([0-9.e+]+)$`)

type scraper struct {
	once  sync.Once
	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	// last[host][incarnation][reason] is the last scraped value.
	last map[int]map[int]map[string]float64
}

func startScraper(ctx context.Context, e *env) *scraper {
	s := &scraper{stopc: make(chan struct{}), done: make(chan struct{}), last: map[int]map[int]map[string]float64{}}
	client := &http.Client{Timeout: time.Second}
	go func() {
		defer close(s.done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			for _, h := range e.hosts {
				if !h.isUp() {
					continue
				}
				_, inc := h.current()
				vals := scrapeFences(client, h.addr)
				if vals == nil {
					continue
				}
				s.mu.Lock()
				if s.last[h.idx] == nil {
					s.last[h.idx] = map[int]map[string]float64{}
				}
				s.last[h.idx][inc] = vals
				s.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-s.stopc:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func scrapeFences(client *http.Client, addr string) map[string]float64 {
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := fenceMetricRE.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			out[m[1]] = v
		}
	}
	return out
}

// stop ends the scraping (after one last round) and returns the sums by
// reason over every host incarnation.
func (s *scraper) stop() map[string]int {
	s.once.Do(func() { close(s.stopc) })
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, incs := range s.last {
		for _, vals := range incs {
			for r, v := range vals {
				out[r] += int(v)
			}
		}
	}
	return out
}

var fenceLogRE = regexp.MustCompile(`msg="(reply rejected by fence|failed attempt fenced off)".* reason=([a-z_]+)`)

// fencesFromLogs counts the fence rejections logged by every host
// incarnation, by reason, and separately the failure reports among them.
func fencesFromLogs(e *env) (replies, failures map[string]int) {
	replies, failures = map[string]int{}, map[string]int{}
	files, _ := filepath.Glob(filepath.Join(e.work, "logs", "host*.log"))
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			if m := fenceLogRE.FindStringSubmatch(sc.Text()); m != nil {
				if m[1] == "reply rejected by fence" {
					replies[m[2]]++
				} else {
					failures[m[2]]++
				}
			}
		}
		fh.Close()
	}
	return replies, failures
}
