package client

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// Every method returns an *Error for an error answer of the API, with its
// status and code (see IsNotFound, IsCode); opts ask for the raw body or
// the status of a successful answer.

func itoa(n int64) string {
	if n == 0 {
		return ""
	}
	return strconv.FormatInt(n, 10)
}

// Health returns the host's health (GET /healthz; no token needed).
func (c *Client) Health(ctx context.Context, opts ...CallOption) (Health, error) {
	var out Health
	err := c.doJSON(ctx, "GET", "/healthz", nil, &out, opts)
	return out, err
}

// ---- modules

// UploadModule uploads a wasm module's bytes (POST /v1/modules) and returns
// it as stored; Module.Created is false when it was stored already. A bad
// module is a 400 invalid_module, one over api.max_module_bytes a 413
// body_too_large.
func (c *Client) UploadModule(ctx context.Context, wasm []byte, opts ...CallOption) (Module, error) {
	var out Module
	if wasm == nil {
		wasm = []byte{}
	}
	err := c.do(ctx, "POST", "/v1/modules", wasm, "application/wasm", &out, opts)
	return out, err
}

// UploadModuleFrom is UploadModule streaming the module's size bytes from
// r (such as an open file) instead of holding them in memory; r must
// yield exactly size bytes. A module over api.max_module_bytes is a 413
// body_too_large, answered as soon as the server has read past the limit.
func (c *Client) UploadModuleFrom(ctx context.Context, r io.Reader, size int64, opts ...CallOption) (Module, error) {
	var out Module
	if size < 0 {
		return out, fmt.Errorf("paddock api POST /v1/modules: negative size %d", size)
	}
	err := c.doStream(ctx, "POST", "/v1/modules", io.LimitReader(r, size), size, "application/wasm", &out, opts)
	return out, err
}

// ListModules lists the stored modules (GET /v1/modules).
func (c *Client) ListModules(ctx context.Context, opts ...CallOption) ([]Module, error) {
	var out ModuleList
	err := c.doJSON(ctx, "GET", "/v1/modules", nil, &out, opts)
	return out.Modules, err
}

// GetModule returns the module with digest "sha256:<hex>" (GET
// /v1/modules/{digest}); 404 module_not_found if there is none.
func (c *Client) GetModule(ctx context.Context, digest string, opts ...CallOption) (Module, error) {
	var out Module
	err := c.doJSON(ctx, "GET", "/v1/modules/"+esc(digest), nil, &out, opts)
	return out, err
}

// ---- plugin workers

// RegisterPlugin registers (or re-registers) a plugin worker binary on the
// host (POST /v1/plugins), which checks and starts it once: a bad binary
// is a 400 invalid_plugin, a host without plugins a 501
// plugins_disabled. The Status option tells 201 (new) from 200.
func (c *Client) RegisterPlugin(ctx context.Context, in PluginRegistration, opts ...CallOption) (Plugin, error) {
	var out Plugin
	err := c.doJSON(ctx, "POST", "/v1/plugins", in, &out, opts)
	return out, err
}

// ListPlugins lists the registered plugin workers (GET /v1/plugins).
func (c *Client) ListPlugins(ctx context.Context, opts ...CallOption) ([]Plugin, error) {
	var out PluginList
	err := c.doJSON(ctx, "GET", "/v1/plugins", nil, &out, opts)
	return out.Plugins, err
}

// GetPlugin returns the plugin worker named name (GET
// /v1/plugins/{plugin}); 404 plugin_not_found if there is none.
func (c *Client) GetPlugin(ctx context.Context, name string, opts ...CallOption) (Plugin, error) {
	var out Plugin
	err := c.doJSON(ctx, "GET", "/v1/plugins/"+esc(name), nil, &out, opts)
	return out, err
}

// ---- agents

// CreateAgent registers an agent (POST /v1/agents): 409 agent_exists if
// the name is taken, 400 unknown_module or unknown_plugin if its binding
// is not there.
func (c *Client) CreateAgent(ctx context.Context, in CreateAgentRequest, opts ...CallOption) (Agent, error) {
	var out Agent
	err := c.doJSON(ctx, "POST", "/v1/agents", in, &out, opts)
	return out, err
}

// UpdateAgent re-binds agent name (PUT /v1/agents/{agent}): new events run
// the new module or plugin, events already started keep theirs. 404
// agent_not_found if there is no such agent.
func (c *Client) UpdateAgent(ctx context.Context, name string, in UpdateAgentRequest, opts ...CallOption) (Agent, error) {
	var out Agent
	err := c.doJSON(ctx, "PUT", agentPath(name), in, &out, opts)
	return out, err
}

// ListAgents lists the agents (GET /v1/agents).
func (c *Client) ListAgents(ctx context.Context, opts ...CallOption) ([]Agent, error) {
	var out AgentList
	err := c.doJSON(ctx, "GET", "/v1/agents", nil, &out, opts)
	return out.Agents, err
}

// GetAgent returns agent name (GET /v1/agents/{agent}); 404
// agent_not_found if there is none.
func (c *Client) GetAgent(ctx context.Context, name string, opts ...CallOption) (Agent, error) {
	var out Agent
	err := c.doJSON(ctx, "GET", agentPath(name), nil, &out, opts)
	return out, err
}

// ---- sessions

// CreateSession creates a session of agent (POST
// /v1/agents/{agent}/sessions): 409 session_exists if in.Key is taken.
func (c *Client) CreateSession(ctx context.Context, agent string, in SessionRequest, opts ...CallOption) (Session, error) {
	var out Session
	err := c.doJSON(ctx, "POST", agentPath(agent)+"/sessions", in, &out, opts)
	return out, err
}

// GetOrCreateSession returns agent's session with key in.Key, creating it
// if there is none (PUT /v1/agents/{agent}/sessions); Session.Created
// tells which. A retried call cannot create two. 400 missing_field without
// a key.
func (c *Client) GetOrCreateSession(ctx context.Context, agent string, in SessionRequest, opts ...CallOption) (Session, error) {
	var out Session
	err := c.doJSON(ctx, "PUT", agentPath(agent)+"/sessions", in, &out, opts)
	return out, err
}

// GetSession returns a session (GET /v1/agents/{agent}/sessions/{session});
// 404 agent_not_found or session_not_found.
func (c *Client) GetSession(ctx context.Context, agent, session string, opts ...CallOption) (Session, error) {
	var out Session
	err := c.doJSON(ctx, "GET", sessionPath(agent, session), nil, &out, opts)
	return out, err
}

// SessionByKey returns agent's session of key that is not destroyed,
// without creating one (GET /v1/agents/{agent}/sessions-by-key/{key});
// 404 agent_not_found or session_not_found.
func (c *Client) SessionByKey(ctx context.Context, agent, key string, opts ...CallOption) (Session, error) {
	var out Session
	err := c.doJSON(ctx, "GET", agentPath(agent)+"/sessions-by-key/"+esc(key), nil, &out, opts)
	return out, err
}

// ListSessions returns a page of agent's sessions (GET
// /v1/agents/{agent}/sessions).
func (c *Client) ListSessions(ctx context.Context, agent string, o ListSessionsOptions, opts ...CallOption) (SessionPage, error) {
	var out SessionPage
	q := query("limit", itoa(int64(o.Limit)), "cursor", o.Cursor)
	err := c.doJSON(ctx, "GET", agentPath(agent)+"/sessions"+q, nil, &out, opts)
	return out, err
}

// DestroySession destroys a session (DELETE
// /v1/agents/{agent}/sessions/{session}) and returns it destroyed: its
// open events are discarded, later signals get 410 session_destroyed.
func (c *Client) DestroySession(ctx context.Context, agent, session string, opts ...CallOption) (Session, error) {
	var out Session
	err := c.doJSON(ctx, "DELETE", sessionPath(agent, session), nil, &out, opts)
	return out, err
}

// ---- signals and events

// SendSignal sends a session a signal (POST
// /v1/agents/{agent}/sessions/{session}/signals): a message, a steer, a
// cancel or a wake (see Signal). Errors: 404 session_not_found, 410
// session_destroyed, 409 idempotency_key_reused (the key was used for
// another signal), nothing_in_flight (a cancel) or turn_in_flight (a
// message under mid_turn reject while a turn runs; nothing written), 413
// signal_too_large.
func (c *Client) SendSignal(ctx context.Context, agent, session string, in Signal, opts ...CallOption) (SignalResult, error) {
	var out SignalResult
	err := c.doJSON(ctx, "POST", sessionPath(agent, session)+"/signals", in, &out, opts)
	return out, err
}

// ListEvents lists a session's actor events by id (GET
// /v1/agents/{agent}/sessions/{session}/events).
func (c *Client) ListEvents(ctx context.Context, agent, session string, o ListEventsOptions, opts ...CallOption) ([]Event, error) {
	var out EventList
	q := query("status", string(o.Status), "after", itoa(o.After), "limit", itoa(int64(o.Limit)))
	err := c.doJSON(ctx, "GET", sessionPath(agent, session)+"/events"+q, nil, &out, opts)
	return out.Events, err
}

// GetEvent returns one event with its error chain (GET
// …/events/{event}); 404 event_not_found.
func (c *Client) GetEvent(ctx context.Context, agent, session string, id int64, opts ...CallOption) (Event, error) {
	var out Event
	err := c.doJSON(ctx, "GET", eventPath(agent, session, id), nil, &out, opts)
	return out, err
}

// GetEventWith is GetEvent asking for more with o: o.IncludeResults adds
// each journal row's recorded result (?include=results).
func (c *Client) GetEventWith(ctx context.Context, agent, session string, id int64, o GetEventOptions, opts ...CallOption) (Event, error) {
	var out Event
	include := ""
	if o.IncludeResults {
		include = "results"
	}
	err := c.doJSON(ctx, "GET", eventPath(agent, session, id)+query("include", include), nil, &out, opts)
	return out, err
}

// Redrive gives a dead-lettered event a new attempt under a new epoch
// (POST …/events/{event}/redrive) and returns it open; 409 not_dead_letter
// if it is not dead-lettered.
func (c *Client) Redrive(ctx context.Context, agent, session string, id int64, opts ...CallOption) (Event, error) {
	var out Event
	err := c.doJSON(ctx, "POST", eventPath(agent, session, id)+"/redrive", nil, &out, opts)
	return out, err
}

// Discard discards a dead-lettered event (POST …/events/{event}/discard);
// 409 not_dead_letter if it is not dead-lettered.
func (c *Client) Discard(ctx context.Context, agent, session string, id int64, opts ...CallOption) (Event, error) {
	var out Event
	err := c.doJSON(ctx, "POST", eventPath(agent, session, id)+"/discard", nil, &out, opts)
	return out, err
}

// Cancel cancels event id, queued or in flight (POST
// …/events/{event}/cancel); 409 event_closed if it is closed already, 404
// event_not_found, 410 session_destroyed. SendSignal with a SignalCancel
// does the same, and with EventID 0 cancels the turn in flight.
func (c *Client) Cancel(ctx context.Context, agent, session string, id int64, opts ...CallOption) (SignalResult, error) {
	var out SignalResult
	err := c.doJSON(ctx, "POST", eventPath(agent, session, id)+"/cancel", nil, &out, opts)
	return out, err
}

// AgentDeadLetters lists agent's dead-lettered events, of all its sessions
// or of o.Session (GET /v1/agents/{agent}/dead-letters).
func (c *Client) AgentDeadLetters(ctx context.Context, agent string, o DeadLetterOptions, opts ...CallOption) ([]DeadLetter, error) {
	q := query("session", o.Session, "after", itoa(o.After), "limit", itoa(int64(o.Limit)))
	return c.deadLetters(ctx, agentPath(agent)+"/dead-letters"+q, opts)
}

// SessionDeadLetters lists a session's dead-lettered events (GET
// …/sessions/{session}/dead-letters); o.Session is ignored.
func (c *Client) SessionDeadLetters(ctx context.Context, agent, session string, o DeadLetterOptions, opts ...CallOption) ([]DeadLetter, error) {
	q := query("after", itoa(o.After), "limit", itoa(int64(o.Limit)))
	return c.deadLetters(ctx, sessionPath(agent, session)+"/dead-letters"+q, opts)
}

func (c *Client) deadLetters(ctx context.Context, path string, opts []CallOption) ([]DeadLetter, error) {
	var out DeadLetterList
	err := c.doJSON(ctx, "GET", path, nil, &out, opts)
	return out.DeadLetters, err
}

// ListAlarms lists a session's pending alarms (GET …/alarms).
func (c *Client) ListAlarms(ctx context.Context, agent, session string, opts ...CallOption) ([]store.Alarm, error) {
	var out AlarmList
	err := c.doJSON(ctx, "GET", sessionPath(agent, session)+"/alarms", nil, &out, opts)
	return out.Alarms, err
}

// Transcript returns a page of a session's committed turns after o.After
// (GET …/transcript); with o.Wait it long-polls for the next turn. 400
// invalid_parameter (field "wait") for a Wait over 60s. ctx must outlast
// o.Wait.
func (c *Client) Transcript(ctx context.Context, agent, session string, o TranscriptOptions, opts ...CallOption) (TranscriptPage, error) {
	var out TranscriptPage
	wait := ""
	if o.Wait > 0 {
		wait = o.Wait.Round(time.Millisecond).String()
	}
	q := query("after", itoa(o.After), "limit", itoa(int64(o.Limit)), "wait", wait)
	err := c.doJSON(ctx, "GET", sessionPath(agent, session)+"/transcript"+q, nil, &out, opts)
	return out, err
}

// ---- secrets

// PutSecret sets the secret name to value (PUT /v1/secrets/{name}),
// creating or replacing it; created tells which (201 or 200). The answer
// never holds the value. Errors: 400 invalid_field (the name) or
// missing_field (an empty value), 413 secret_too_large, 409
// secret_declared (the host's config declares that name and wins), 501
// secrets_disabled (the host has no secrets_key). created is read from the
// answer's status, so a Status option given here is not filled.
func (c *Client) PutSecret(ctx context.Context, name, value string, opts ...CallOption) (sec Secret, created bool, err error) {
	var status int
	opts = append(opts, Status(&status))
	err = c.doJSON(ctx, "PUT", "/v1/secrets/"+esc(name), PutSecretRequest{Value: value}, &sec, opts)
	return sec, status == 201, err
}

// ListSecrets lists the secrets set through the API, by name, without
// values (GET /v1/secrets).
func (c *Client) ListSecrets(ctx context.Context, opts ...CallOption) ([]Secret, error) {
	var out SecretList
	err := c.doJSON(ctx, "GET", "/v1/secrets", nil, &out, opts)
	return out.Secrets, err
}

// DeleteSecret deletes a secret set through the API (DELETE
// /v1/secrets/{name}); 404 secret_not_found if there is none.
func (c *Client) DeleteSecret(ctx context.Context, name string, opts ...CallOption) error {
	return c.doJSON(ctx, "DELETE", "/v1/secrets/"+esc(name), nil, nil, opts)
}

// ---- waits

func waitPath(agent, session, id string) string {
	return sessionPath(agent, session) + "/waits/" + esc(id)
}

// SessionWaits lists a session's waits, oldest first (GET
// …/sessions/{session}/waits).
func (c *Client) SessionWaits(ctx context.Context, agent, session string, o ListWaitsOptions, opts ...CallOption) (WaitList, error) {
	var out WaitList
	q := query("status", string(o.Status), "after", itoa(o.After), "limit", itoa(int64(o.Limit)))
	err := c.doJSON(ctx, "GET", sessionPath(agent, session)+"/waits"+q, nil, &out, opts)
	return out, err
}

// AgentWaits lists the waits of all of agent's sessions, oldest first (GET
// /v1/agents/{agent}/waits), e.g. the open ones with Status "open".
func (c *Client) AgentWaits(ctx context.Context, agent string, o ListWaitsOptions, opts ...CallOption) (WaitList, error) {
	var out WaitList
	q := query("status", string(o.Status), "after", itoa(o.After), "limit", itoa(int64(o.Limit)))
	err := c.doJSON(ctx, "GET", agentPath(agent)+"/waits"+q, nil, &out, opts)
	return out, err
}

// GetWait returns one wait (GET …/waits/{wait}); 404 wait_not_found.
func (c *Client) GetWait(ctx context.Context, agent, session, id string, opts ...CallOption) (Wait, error) {
	var out Wait
	err := c.doJSON(ctx, "GET", waitPath(agent, session, id), nil, &out, opts)
	return out, err
}

// ResolveWait resolves an open wait (POST …/waits/{wait}) and returns it
// resolved; the session wakes. Errors: 404 wait_not_found, 409
// wait_resolved (resolved already), 410 wait_expired, wait_cancelled or
// session_destroyed, 400 for a body the wait's kind does not take.
func (c *Client) ResolveWait(ctx context.Context, agent, session, id string, in ResolveWaitRequest, opts ...CallOption) (Wait, error) {
	var out Wait
	err := c.doJSON(ctx, "POST", waitPath(agent, session, id), in, &out, opts)
	return out, err
}

// ---- tokens and the audit log

// CreateToken creates an API token (POST /v1/tokens; admins) and returns
// it with its value, which is answered this once. Errors: 400
// invalid_field or missing_field (role, name), 403 forbidden (a caller of
// another namespace, or a role above the caller's), 404
// namespace_not_found.
func (c *Client) CreateToken(ctx context.Context, in CreateTokenRequest, opts ...CallOption) (NewToken, error) {
	var out NewToken
	err := c.doJSON(ctx, "POST", "/v1/tokens", in, &out, opts)
	return out, err
}

// ListTokens lists the tokens, revoked ones included, without their
// values (GET /v1/tokens; admins).
func (c *Client) ListTokens(ctx context.Context, opts ...CallOption) ([]Token, error) {
	var out TokenList
	err := c.doJSON(ctx, "GET", "/v1/tokens", nil, &out, opts)
	return out.Tokens, err
}

// RevokeToken revokes a token (DELETE /v1/tokens/{id}; admins) and
// returns it; revoking it again answers it unchanged. 404 token_not_found
// for an unknown id.
func (c *Client) RevokeToken(ctx context.Context, id string, opts ...CallOption) (Token, error) {
	var out Token
	err := c.doJSON(ctx, "DELETE", "/v1/tokens/"+esc(id), nil, &out, opts)
	return out, err
}

// ListAudit returns a page of the audit log, newest first (GET /v1/audit;
// admins): rows before the id before (0: from the newest), at most limit
// (0: 100, at most 1000).
func (c *Client) ListAudit(ctx context.Context, before int64, limit int, opts ...CallOption) (AuditPage, error) {
	var out AuditPage
	q := query("before", itoa(before), "limit", itoa(int64(limit)))
	err := c.doJSON(ctx, "GET", "/v1/audit"+q, nil, &out, opts)
	return out, err
}
