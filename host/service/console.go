package service

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// The read-only operations below serve the web console (host/console):
// browsing sessions across agents with filters, a session's state and
// stream head, and the host's figures. They hold the rules of those reads
// so that a second front door shows the same thing.

// Session filters of BrowseSessions' Status, besides the store's
// statuses active, sleeping and destroyed.
const (
	// FilterPending selects sessions waiting for capacity.
	FilterPending = "pending"
)

// MaxBrowseScan bounds the sessions BrowseSessions reads from the store
// for one page: a filter that matches few sessions returns a partial page
// and a cursor to go on from, never a read of every session.
const MaxBrowseScan = 5000

// SessionFilter selects a page of sessions for BrowseSessions.
type SessionFilter struct {
	// Agent is an agent's name ("": every agent, by name).
	Agent string
	// Status is active, sleeping, pending, destroyed or "" (any).
	Status string
	// Key, when set, is the exact session key.
	Key string
	// Text, when set, must occur in the session id, key or sleep reason
	// (case-insensitive).
	Text string
	// After is the previous page's Next ("" to start).
	After string
	// Limit is the page size: 0 means DefaultSessionLimit, at most
	// MaxSessionLimit.
	Limit int
}

// SessionRow is one session of a browse page with its agent's name.
type SessionRow struct {
	Agent string
	store.Session
}

// SessionBrowse is a page of BrowseSessions.
type SessionBrowse struct {
	Sessions []SessionRow
	// Next is the cursor of the next page ("" after the last).
	Next string
	// Scanned is how many sessions were read to fill the page; Partial is
	// set when MaxBrowseScan stopped the scan before the page was full.
	Scanned int
	Partial bool
}

// BrowseSessions pages sessions of one agent or of all (by agent name,
// then session id), filtered by f. The cursor is "<agent>/<session id>".
// It reads the store a page at a time (ListSessions) and stops at
// MaxBrowseScan sessions read: a filter that matches little may return a
// short page with a Next to go on. Refusals: *InvalidError (status,
// limit, after), a *NotFoundError for an unknown agent.
//
// Missing store support: a filter by status, key or text in the query
// itself (an index per agent and status; a lookup by key without
// creating), which would make a filtered page one query.
func (s *Service) BrowseSessions(ctx context.Context, f SessionFilter) (SessionBrowse, error) {
	switch f.Status {
	case "", string(store.SessionActive), string(store.SessionSleeping), string(store.SessionDestroyed), FilterPending:
	default:
		return SessionBrowse{}, invalid("status", "status %q must be active, sleeping, pending or destroyed", f.Status)
	}
	n, err := pageSize(f.Limit, DefaultSessionLimit, MaxSessionLimit)
	if err != nil {
		return SessionBrowse{}, err
	}
	afterAgent, afterID, _ := strings.Cut(f.After, "/")
	if f.After != "" && afterAgent == "" {
		return SessionBrowse{}, invalid("after", "after %q must be <agent>/<session id>", f.After)
	}
	var agents []store.Agent
	if f.Agent != "" {
		a, err := s.GetAgent(ctx, f.Agent)
		if err != nil {
			return SessionBrowse{}, err
		}
		agents = []store.Agent{a}
	} else if agents, err = s.ListAgents(ctx); err != nil {
		return SessionBrowse{}, err
	}
	sort.Slice(agents, func(i, j int) bool { return agents[i].Name < agents[j].Name })
	text := strings.ToLower(f.Text)
	var out SessionBrowse
	for _, a := range agents {
		cursor := ""
		switch {
		case afterAgent != "" && a.Name < afterAgent:
			continue
		case a.Name == afterAgent:
			cursor = afterID
		}
		for {
			page := min(MaxSessionLimit, MaxBrowseScan-out.Scanned)
			xs, err := s.st.ListSessions(ctx, store.ListSessionsParams{AgentUID: a.UID, After: cursor, Limit: page})
			if err != nil {
				return SessionBrowse{}, wrap("browse sessions", err)
			}
			for _, x := range xs {
				out.Scanned++
				cursor = x.SessionID
				if matchSession(x, f, text) {
					out.Sessions = append(out.Sessions, SessionRow{Agent: a.Name, Session: x})
				}
				if len(out.Sessions) == n || out.Scanned == MaxBrowseScan {
					out.Next = a.Name + "/" + x.SessionID
					out.Partial = len(out.Sessions) < n
					return out, nil
				}
			}
			if len(xs) < page {
				break
			}
		}
	}
	return out, nil
}

// matchSession applies f's status, key and text filters (text already
// lower case).
func matchSession(x store.Session, f SessionFilter, text string) bool {
	switch f.Status {
	case "":
	case FilterPending:
		if x.PendingSince == nil || x.Status == store.SessionDestroyed {
			return false
		}
	default:
		if string(x.Status) != f.Status {
			return false
		}
	}
	if f.Key != "" && x.Key != f.Key {
		return false
	}
	if text != "" && !strings.Contains(strings.ToLower(x.SessionID), text) &&
		!strings.Contains(strings.ToLower(x.Key), text) && !strings.Contains(strings.ToLower(x.SleepReason), text) {
		return false
	}
	return true
}

// SessionState returns session x's committed state (nil: none committed
// yet).
func (s *Service) SessionState(ctx context.Context, x store.Session) ([]byte, error) {
	b, err := s.st.SessionState(ctx, x.ActorKey)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &NotFoundError{Resource: ResourceSession, Field: "session", Message: fmt.Sprintf("session %q not found", x.SessionID)}
	}
	return b, wrap("session state", err)
}

// StreamHead returns the number of session x's last stream frame (0: none
// yet): a page that renders the transcript after reading it and follows
// the stream from it misses no turn.
func (s *Service) StreamHead(ctx context.Context, x store.Session) (int64, error) {
	heads, err := s.st.StreamHeads(ctx, []store.ActorKey{x.ActorKey})
	if err != nil {
		return 0, wrap("stream head", err)
	}
	return heads[x.ActorKey], nil
}

// Running reports whether a controller for session x runs on this host.
func (s *Service) Running(x store.Session) bool { return s.h.Running(x.ActorKey) }

// AgentPolicy returns the policy agent a runs under on this host now (the
// config's defaults and its override for the agent).
func (s *Service) AgentPolicy(a store.Agent) host.AgentPolicy { return s.h.Policy().For(a.Name) }

// Figures are the host's own figures for an overview.
type Figures struct {
	// HostID and Store name this host and its store driver.
	HostID, Store string
	// Controllers is the number of live controllers on this host.
	Controllers int
	// Pools are the configured capacity pools: name → capacity.
	Pools map[string]int
	// Metrics are the host's Prometheus counters and gauges (histograms
	// as their sample count), by metric name and labels, sorted.
	Metrics []Metric
}

// Metric is one sample of the host's registry.
type Metric struct {
	// Name is the metric's name; Labels its labels as "k=v, …" ("" none).
	Name, Labels string
	Value        float64
}

// Figures gathers this host's figures from its policy and its metrics
// registry.
func (s *Service) Figures() (Figures, error) {
	f := Figures{HostID: s.h.ID(), Store: s.st.Driver(), Controllers: s.h.Controllers(), Pools: map[string]int{}}
	for name, n := range s.h.Policy().Pools {
		f.Pools[name] = n
	}
	mfs, err := s.h.Metrics().Registry.Gather()
	if err != nil {
		return f, wrap("gather metrics", err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			default:
				continue
			}
			f.Metrics = append(f.Metrics, Metric{Name: mf.GetName(), Labels: labels(m.GetLabel()), Value: v})
		}
	}
	return f, nil
}

func labels(ls []*dto.LabelPair) string {
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ", ")
}
