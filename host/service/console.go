package service

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

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
	FilterPending = store.StatusPending
)

// MaxBrowseScan bounds the sessions BrowseSessions reads for one page
// when it filters by text (store.MaxBrowseScan): a text that matches few
// returns a partial page and a cursor to go on from, never a read of
// every session. The other filters are decided by indexes and fill pages.
const MaxBrowseScan = store.MaxBrowseScan

// SessionFilter selects a page of sessions for BrowseSessions.
type SessionFilter struct {
	// Agent is an agent's name or uid ("": every agent).
	Agent string
	// Status is active, sleeping, pending, destroyed or "" (any).
	Status string
	// SleepReason, with Status sleeping, selects that reason (crash,
	// capacity, …).
	SleepReason string
	// Key, when set, is the exact session key.
	Key string
	// Text, when set, must occur in the session id or key
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
	// Scanned is how many sessions the indexed filters selected for the
	// page; Partial is set when MaxBrowseScan stopped a text filter's read
	// before the page was full.
	Scanned int
	Partial bool
}

// BrowseSessions pages sessions of every agent or one, by agent uid then
// session id, filtered by f in one store query (store.BrowseSessions:
// agent, status, sleep reason, pending and key by index; text within at
// most MaxBrowseScan of those). The cursor is "<agent uid>/<session id>".
// Refusals: *InvalidError (status, sleep_reason, limit, after), a
// *NotFoundError for an unknown agent.
func (s *Service) BrowseSessions(ctx context.Context, f SessionFilter) (SessionBrowse, error) {
	switch f.Status {
	case "", string(store.SessionActive), string(store.SessionSleeping), string(store.SessionDestroyed), FilterPending:
	default:
		return SessionBrowse{}, invalid("status", "status %q must be active, sleeping, pending or destroyed", f.Status)
	}
	if f.SleepReason != "" && f.Status != string(store.SessionSleeping) {
		return SessionBrowse{}, invalid("sleep_reason", "sleep_reason %q needs status sleeping", f.SleepReason)
	}
	n, err := pageSize(f.Limit, DefaultSessionLimit, MaxSessionLimit)
	if err != nil {
		return SessionBrowse{}, err
	}
	var after store.ActorKey
	if f.After != "" {
		var ok bool
		after.AgentUID, after.SessionID, ok = strings.Cut(f.After, "/")
		if !ok || after.AgentUID == "" || after.SessionID == "" {
			return SessionBrowse{}, invalid("after", "the page cursor %q must be <agent uid>/<session id>, a previous page's next cursor", f.After)
		}
	}
	agents, err := s.ListAgents(ctx)
	if err != nil {
		return SessionBrowse{}, err
	}
	names := make(map[string]string, len(agents))
	for _, a := range agents {
		names[a.UID] = a.Name
	}
	p := store.BrowseSessionsParams{Namespace: NamespaceOf(ctx), Status: f.Status, SleepReason: f.SleepReason, Key: f.Key, Text: f.Text, After: after, Limit: n}
	if f.Agent != "" {
		a, err := s.GetAgent(ctx, f.Agent)
		if err != nil {
			return SessionBrowse{}, err
		}
		p.AgentUID, names[a.UID] = a.UID, a.Name
	}
	page, err := s.st.BrowseSessions(ctx, p)
	if err != nil {
		return SessionBrowse{}, wrap("browse sessions", err)
	}
	out := SessionBrowse{Sessions: make([]SessionRow, 0, len(page.Sessions)), Scanned: page.Scanned, Partial: page.Partial}
	for _, x := range page.Sessions {
		out.Sessions = append(out.Sessions, SessionRow{Agent: names[x.AgentUID], Session: x})
	}
	if page.Next != (store.ActorKey{}) {
		out.Next = page.Next.String()
	}
	return out, nil
}

// SessionByKey returns agent a's session of key k that is not destroyed
// (the one a get-or-create would return), without creating one. None:
// *NotFoundError (session).
func (s *Service) SessionByKey(ctx context.Context, a store.Agent, k string) (store.Session, error) {
	if k == "" {
		return store.Session{}, missing("key", "key is empty")
	}
	page, err := s.st.BrowseSessions(ctx, store.BrowseSessionsParams{AgentUID: a.UID, Key: k, Limit: store.MaxPageLimit})
	if err != nil {
		return store.Session{}, wrap("session by key", err)
	}
	for _, x := range page.Sessions {
		if x.Status != store.SessionDestroyed {
			return x, nil
		}
	}
	return store.Session{}, &NotFoundError{Resource: ResourceSession, Field: "key", Message: fmt.Sprintf("no live session of agent %q has key %q", a.Name, k)}
}

// AgentVersions pages agent a's versions, newest first
// (store.ListAgentVersions); before is the last version of the previous
// page (0: from the newest).
func (s *Service) AgentVersions(ctx context.Context, a store.Agent, before int64, limit int) ([]store.AgentVersion, error) {
	vs, err := s.st.ListAgentVersions(ctx, store.ListAgentVersionsParams{AgentUID: a.UID, Before: before, Limit: limit})
	return vs, wrap("agent versions", err)
}

// CurrentActivation returns session x's live activation, or else its last
// one, with the database clock (nil, nil: it never had one).
func (s *Service) CurrentActivation(ctx context.Context, x store.Session) (*store.ActivationInfo, error) {
	a, err := s.st.CurrentActivation(ctx, x.ActorKey)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, wrap("current activation", err)
	}
	return &a, nil
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
func (s *Service) AgentPolicy(a store.Agent) host.AgentPolicy { return s.h.Policy().ForAgent(a) }

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
// registry. For a caller of one namespace it leaves out the samples
// labelled by agent (paddock_host_calls_replayed_total{agent=…}): they
// are host-wide and would name the agents of every namespace.
func (s *Service) Figures(ctx context.Context) (Figures, error) {
	scoped := callerOf(ctx).Namespace != ""
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
			if scoped && hasLabel(m.GetLabel(), "agent") {
				continue
			}
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

// hasLabel reports whether ls has a label called name.
func hasLabel(ls []*dto.LabelPair, name string) bool {
	for _, l := range ls {
		if l.GetName() == name {
			return true
		}
	}
	return false
}

func labels(ls []*dto.LabelPair) string {
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ", ")
}

// RemoteWorker is one remote worker session admitted by this host's
// fabric broker, as the overview shows it.
type RemoteWorker struct {
	// ID is the worker's id; Pools the pools it serves.
	ID    string
	Pools []string
	// Capacity is the turns it runs at once; InFlight the turns this host
	// dispatched to it that have not finished; Free and Running are from
	// its last heartbeat.
	Capacity, InFlight, Free, Running int
	// LastHeard is when this host last heard from it (host clock).
	LastHeard time.Time
}

// WithWorkers sets the source of the remote workers the overview lists
// (the fabric broker's; nil: this host runs no fabric). The service does
// not depend on the fabric: the caller adapts its broker.
func (s *Service) WithWorkers(workers func() []RemoteWorker) *Service {
	s.workers = workers
	return s
}

// HostLeases are the live activations one host holds (by the store).
type HostLeases struct {
	HostID string
	// Live activations and, of those, Busy with a turn in flight.
	Live, Busy int64
	// FirstExpiry and LastExpiry are the earliest and latest lease expiry
	// (DB clock); FirstLeft how long the earliest has left at Now.
	FirstExpiry, LastExpiry time.Time
	FirstLeft               time.Duration
}

// PoolUse is a capacity pool's use as the overview shows it.
type PoolUse struct {
	Name string
	// Capacity is the pool's capacity on this host (0: not configured
	// here, e.g. an agent's pool another host serves).
	Capacity int
	// Here and Everywhere count the live activations of the pool's agents
	// on this host and on all hosts; Waiting the sessions of its agents
	// pending capacity.
	Here, Everywhere, Waiting int64
}

// Cluster is the store's side of the overview: hosts and their leases,
// pools in use with waiting sessions, turns of the last minute, and this
// host's remote workers.
type Cluster struct {
	// Now is the database clock of the read.
	Now             time.Time
	Hosts           []HostLeases
	Pools           []PoolUse
	TurnsLastMinute int64
	// Fabric is set when this host runs a fabric broker; Workers are its
	// admitted workers.
	Fabric  bool
	Workers []RemoteWorker
}

// Cluster reads the overview's figures from the store in one snapshot
// (store.ClusterFigures) and maps agents to pools by this host's policy
// (an agent's pool is its policy's Pool). The agents are those of every
// namespace ctx's caller may act in (Namespaces): for a caller of one
// namespace, the hosts' and pools' counts are its namespace's share (the
// activations and pending sessions of other namespaces' agents are left
// out); TurnsLastMinute stays host-wide (a count, no names).
func (s *Service) Cluster(ctx context.Context) (Cluster, error) {
	f, err := s.st.ClusterFigures(ctx)
	if err != nil {
		return Cluster{}, wrap("cluster figures", err)
	}
	pol := s.h.Policy()
	poolOf := map[string]string{}
	for _, ns := range s.Namespaces(ctx) {
		agents, err := s.st.ListAgents(ctx, ns)
		if err != nil {
			return Cluster{}, wrap("list agents", err)
		}
		for _, a := range agents {
			poolOf[a.UID] = pol.ForAgent(a).Pool
		}
	}
	// shown: a caller of one namespace sees its agents' share only; a
	// caller of every namespace also the agents of a namespace no longer
	// declared (in the "(unknown)" pool).
	scoped := callerOf(ctx).Namespace != ""
	shown := func(agentUID string) bool {
		_, ok := poolOf[agentUID]
		return ok || !scoped
	}
	pools := map[string]*PoolUse{}
	use := func(name string) *PoolUse {
		if pools[name] == nil {
			pools[name] = &PoolUse{Name: name, Capacity: pol.Pools[name]}
		}
		return pools[name]
	}
	for name := range pol.Pools {
		use(name)
	}
	out := Cluster{Now: f.Now, TurnsLastMinute: f.TurnsLastMinute}
	hosts := map[string]*HostLeases{}
	for _, l := range f.Live {
		if !shown(l.AgentUID) {
			continue
		}
		h := hosts[l.HostID]
		if h == nil {
			h = &HostLeases{HostID: l.HostID, FirstExpiry: l.FirstExpiry, LastExpiry: l.LastExpiry}
			hosts[l.HostID] = h
		}
		h.Live += l.Live
		h.Busy += l.Busy
		if l.FirstExpiry.Before(h.FirstExpiry) {
			h.FirstExpiry = l.FirstExpiry
		}
		if l.LastExpiry.After(h.LastExpiry) {
			h.LastExpiry = l.LastExpiry
		}
		p := use(poolOf[l.AgentUID])
		p.Everywhere += l.Live
		if l.HostID == s.h.ID() {
			p.Here += l.Live
		}
	}
	for agent, n := range f.Pending {
		if !shown(agent) {
			continue
		}
		use(poolOf[agent]).Waiting += n
	}
	for _, h := range hosts {
		h.FirstLeft = h.FirstExpiry.Sub(f.Now)
		out.Hosts = append(out.Hosts, *h)
	}
	sort.Slice(out.Hosts, func(i, j int) bool { return out.Hosts[i].HostID < out.Hosts[j].HostID })
	for _, p := range pools {
		out.Pools = append(out.Pools, *p)
	}
	sort.Slice(out.Pools, func(i, j int) bool { return out.Pools[i].Name < out.Pools[j].Name })
	if s.workers != nil {
		out.Fabric, out.Workers = true, s.workers()
	}
	return out, nil
}
