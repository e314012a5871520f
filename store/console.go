package store

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The reads below serve the web console (host/console through
// host/service): an agent's versions, a session's current activation, a
// filtered session browse and the cluster figures of the overview. Their
// rules live here; the drivers hold only SQL.

// AgentVersion is one version of an agent's definition as the store holds
// it: what it runs and its crash policy. CreateAgent appends version 1 in
// the agent's creating transaction and, on an upsert, the next version in
// the updating transaction when NewAgentVersion says the definition
// changed. Pools and policies live in the host's config, not here.
type AgentVersion struct {
	AgentUID string `json:"agent_uid"`
	// Version counts the agent's versions from 1.
	Version      int64       `json:"version"`
	Kind         string      `json:"kind"`
	ModuleDigest string      `json:"module_digest,omitempty"`
	Plugin       string      `json:"plugin,omitempty"`
	CrashPolicy  CrashPolicy `json:"crash_policy"`
	// CreatedAt is when the version was written (DB clock).
	CreatedAt time.Time `json:"created_at"`
}

// NewAgentVersion is the one rule of what makes a new agent version: an
// agent just created (prev nil), or one whose kind, module digest, plugin
// worker or crash policy differs from prev's. An upsert that changes
// nothing appends no version. Both drivers call it inside CreateAgent's
// transaction with the row they read under lock.
func NewAgentVersion(prev *Agent, next Agent) bool {
	return prev == nil || prev.Kind != next.Kind || prev.ModuleDigest != next.ModuleDigest ||
		prev.Plugin != next.Plugin || prev.CrashPolicy != next.CrashPolicy
}

// VersionOf returns agent a's definition as version n.
func VersionOf(a Agent, n int64) AgentVersion {
	return AgentVersion{AgentUID: a.UID, Version: n, Kind: a.Kind, ModuleDigest: a.ModuleDigest, Plugin: a.Plugin,
		CrashPolicy: a.CrashPolicy}
}

// ListAgentVersionsParams page an agent's versions, newest first.
type ListAgentVersionsParams struct {
	AgentUID string
	// Before is the last version of the previous page (0: from the newest).
	Before int64
	// Limit is the page size (PageLimit).
	Limit int
}

// ActivationInfo is a session's current activation as the console shows
// it: the live one, or else the last one, with the database clock read in
// the same statement (to judge the lease by the clock that decides it).
type ActivationInfo struct {
	Activation
	CreatedAt time.Time  `json:"created_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	EndReason string     `json:"end_reason,omitempty"`
	// Now is the database clock when the row was read.
	Now time.Time `json:"db_now"`
}

// Live reports whether the activation is live (starting, active or
// draining; docs/DESIGN.md invariant 1).
func (a ActivationInfo) Live() bool {
	return a.State == ActivationStarting || a.State == ActivationActive || a.State == ActivationDraining
}

// LeaseLeft is how long the lease has left by the database clock (≤ 0:
// expired); 0 when the activation is not live.
func (a ActivationInfo) LeaseLeft() time.Duration {
	if !a.Live() {
		return 0
	}
	return a.LeaseExpiresAt.Sub(a.Now)
}

// Session filters of BrowseSessionsParams.Status besides the session
// statuses active, sleeping and destroyed.
const (
	// StatusPending selects sessions waiting for capacity (pending_since
	// set) that are not destroyed.
	StatusPending = "pending"
)

// MaxBrowseScan bounds the sessions one BrowseSessions call reads when a
// text filter is set (the indexed filters — agent, status, sleep reason,
// pending, key — read only matching rows): a text that matches little
// returns a short page with a cursor to go on from, never a read of every
// session.
const MaxBrowseScan = 5000

// BrowseSessionsParams select a page of sessions, in (agent uid, session
// id) order.
type BrowseSessionsParams struct {
	// Namespace, when set, is the only namespace whose agents' sessions
	// are read (AnyNamespace: every namespace).
	Namespace string
	// AgentUID, when set, is the only agent whose sessions are read.
	AgentUID string
	// Status is active, sleeping, destroyed, pending (StatusPending) or ""
	// (any).
	Status string
	// SleepReason, with Status sleeping, selects that sleep reason.
	SleepReason string
	// Key, when set, is the exact session key.
	Key string
	// Text, when set, must occur in the session id or key
	// (case-insensitive substring; a prefix is a substring).
	Text string
	// After is the previous page's Next (zero: from the start).
	After ActorKey
	// Limit is the page size (PageLimit).
	Limit int
}

// SessionPage is a page of BrowseSessions.
type SessionPage struct {
	Sessions []Session
	// Next is where the next page starts (zero after the last).
	Next ActorKey
	// Scanned is how many sessions the indexed filters selected to fill
	// the page (the text filter applies to those); Partial is set when
	// MaxBrowseScan stopped the read before the page was full.
	Scanned int
	Partial bool
}

// CheckBrowse validates p: a known status, a sleep reason only with
// sleeping, a cursor with both halves or none.
func CheckBrowse(p BrowseSessionsParams) error {
	switch p.Status {
	case "", string(SessionActive), string(SessionSleeping), string(SessionDestroyed), StatusPending:
	default:
		return fmt.Errorf("status %q must be active, sleeping, pending or destroyed: %w", p.Status, ErrInvalid)
	}
	if p.SleepReason != "" && p.Status != string(SessionSleeping) {
		return fmt.Errorf("sleep reason %q needs status sleeping: %w", p.SleepReason, ErrInvalid)
	}
	if (p.After.AgentUID == "") != (p.After.SessionID == "") {
		return fmt.Errorf("cursor %q needs an agent uid and a session id: %w", p.After, ErrInvalid)
	}
	return nil
}

// BrowseScan is how many sessions a BrowseSessions call of p reads at
// most: the page size without a text filter, MaxBrowseScan with one.
func BrowseScan(p BrowseSessionsParams) int {
	if p.Text == "" {
		return PageLimit(p.Limit)
	}
	return max(MaxBrowseScan, PageLimit(p.Limit))
}

// BrowsePage builds the page from the matching rows (at most the page
// size, in order), the number of rows scanned and the last one scanned.
func BrowsePage(p BrowseSessionsParams, rows []Session, scanned int, last ActorKey) SessionPage {
	out := SessionPage{Sessions: rows, Scanned: scanned}
	switch {
	case len(rows) == PageLimit(p.Limit):
		out.Next = rows[len(rows)-1].ActorKey
	case scanned == BrowseScan(p):
		out.Next, out.Partial = last, true
	}
	return out
}

// LiveActivations counts the live activations of one agent on one host,
// with their earliest and latest lease expiry.
type LiveActivations struct {
	HostID   string `json:"host_id"`
	AgentUID string `json:"agent_uid"`
	Live     int64  `json:"live"`
	// Busy is how many of them have a turn in flight (a current event).
	Busy                    int64     `json:"busy"`
	FirstExpiry, LastExpiry time.Time `json:"-"`
}

// ClusterFigures are the store's figures for an overview, read in one
// snapshot, bounded by the live activations and the pending sessions
// (partial indexes) and the turns of the last minute (index on
// committed_at).
type ClusterFigures struct {
	// Now is the database clock of the read.
	Now time.Time
	// Live are the live activations by host, then agent.
	Live []LiveActivations
	// Pending is the number of sessions waiting for capacity, by agent
	// uid (not destroyed, pending_since set).
	Pending map[string]int64
	// TurnsLastMinute counts the turns committed in the minute before Now.
	TurnsLastMinute int64
}

// BrowseWhere returns the indexed conditions of a BrowseSessions statement
// for p, the rule both drivers apply (each holds the rest of the
// statement): the status as a literal of the fixed set CheckBrowse admits,
// so that the partial indexes apply under a generic plan; the cursor as a
// bound on session_id alone when the agent is fixed (an index range after
// the agent's equality), the row value across agents. Parameters are
// written placeholder + their number from 1 ("$" for PostgreSQL, "?" for
// SQLite), and args are their values in order.
func BrowseWhere(p BrowseSessionsParams, placeholder string) (string, []any) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return placeholder + strconv.Itoa(len(args))
	}
	if p.AgentUID != "" {
		conds = append(conds, "s.agent_uid = "+arg(p.AgentUID))
	}
	if p.Namespace != "" {
		// The agents of one namespace: the (namespace, name) index.
		conds = append(conds, "s.agent_uid IN (SELECT agent_uid FROM agents WHERE namespace = "+arg(p.Namespace)+")")
	}
	switch p.Status {
	case string(SessionActive):
		conds = append(conds, "s.status = 'active'")
	case string(SessionSleeping):
		conds = append(conds, "s.status = 'sleeping'")
		if p.SleepReason != "" {
			conds = append(conds, "s.sleep_reason = "+arg(p.SleepReason))
		}
	case string(SessionDestroyed):
		conds = append(conds, "s.status = 'destroyed'")
	case StatusPending:
		conds = append(conds, "s.pending_since IS NOT NULL AND s.status <> 'destroyed'")
	}
	if p.Key != "" {
		conds = append(conds, "s.key = "+arg(p.Key))
	}
	switch {
	case p.After.AgentUID == "":
	case p.AgentUID == "":
		conds = append(conds, "(s.agent_uid, s.session_id) > ("+arg(p.After.AgentUID)+", "+arg(p.After.SessionID)+")")
	case p.After.AgentUID == p.AgentUID:
		conds = append(conds, "s.session_id > "+arg(p.After.SessionID))
	case p.After.AgentUID > p.AgentUID:
		conds = append(conds, "false")
	}
	if len(conds) == 0 {
		return "true", args
	}
	return strings.Join(conds, " AND "), args
}
