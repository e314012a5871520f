package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// client talks to a Paddock host's HTTP API.
type client struct {
	server, token, output string
	http                  http.Client
	// raw is the body of the last successful response; --output json
	// prints it as the server sent it.
	raw json.RawMessage
}

// apiError is an error response of the API.
type apiError struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("%s (HTTP %d): %s", e.Code, e.Status, e.Message)
	if e.Field != "" {
		s += " [field " + e.Field + "]"
	}
	return s
}

// do sends a request and decodes a JSON response into out (if non-nil).
func (c *client) do(ctx context.Context, method, path string, body io.Reader, contentType string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.server, "/")+path, body)
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the Paddock API at %s (is `paddock serve` running?): %w", c.server, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 400 {
		var env struct {
			Error *apiError `json:"error"`
		}
		if json.Unmarshal(data, &env) == nil && env.Error != nil {
			env.Error.Status = resp.StatusCode
			return env.Error
		}
		return &apiError{Status: resp.StatusCode, Code: "http_error", Message: strings.TrimSpace(string(data))}
	}
	c.raw = data
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

func (c *client) json(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	return c.do(ctx, method, path, body, "application/json", out)
}

// print writes v as indented JSON with --output json, else calls text.
func (c *client) print(cmd *cobra.Command, v any, text func(w io.Writer)) error {
	if c.output == "json" {
		if raw, ok := v.(json.RawMessage); ok {
			var buf bytes.Buffer
			if err := json.Indent(&buf, raw, "", "  "); err != nil {
				return err
			}
			buf.WriteByte('\n')
			_, err := buf.WriteTo(cmd.OutOrStdout())
			return err
		}
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	if c.output != "text" {
		return fmt.Errorf("--output %q: must be text or json", c.output)
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	text(tw)
	return tw.Flush()
}

type module struct {
	Digest     string    `json:"digest"`
	Size       int64     `json:"size"`
	ABIVersion int       `json:"abi_version"`
	CreatedAt  time.Time `json:"created_at"`
	Created    bool      `json:"created"`
}

type agent struct {
	UID         string `json:"uid"`
	Name        string `json:"name"`
	Kind        string `json:"kind"`
	Module      string `json:"module"`
	Plugin      string `json:"plugin"`
	CrashPolicy string `json:"crash_policy"`
}

type session struct {
	Agent        string     `json:"agent"`
	SessionID    string     `json:"session_id"`
	Key          string     `json:"key"`
	Status       string     `json:"status"`
	CrashPolicy  string     `json:"crash_policy"`
	ActorEpoch   int64      `json:"actor_epoch"`
	TurnCount    int64      `json:"turn_count"`
	EventCount   int64      `json:"event_count"`
	OpenEvents   int64      `json:"open_events"`
	DeadLetters  int64      `json:"dead_letters"`
	Created      *bool      `json:"created"`
	SleepTS      *time.Time `json:"sleep_ts"`
	SleepReason  string     `json:"sleep_reason"`
	DestroyTS    *time.Time `json:"destroy_ts"`
	PendingSince *time.Time `json:"pending_since"`
}

// upload uploads the wasm module in file and returns it as stored.
func (c *client) upload(ctx context.Context, file string) (module, error) {
	var m module
	b, err := os.ReadFile(file)
	if err != nil {
		return m, err
	}
	err = c.do(ctx, "POST", "/v1/modules", bytes.NewReader(b), "application/wasm", &m)
	return m, err
}

// moduleDigest resolves a --module value: a .wasm file is uploaded and
// its digest returned; anything else is taken as a digest.
func (c *client) moduleDigest(ctx context.Context, ref string) (string, error) {
	if !strings.HasSuffix(ref, ".wasm") {
		return ref, nil
	}
	m, err := c.upload(ctx, ref)
	return m.Digest, err
}

// runs describes what an agent is bound to: "module sha256:…" or
// "plugin name@sha256:…".
func (a agent) runs() string {
	if a.Plugin != "" {
		return "plugin " + a.Plugin
	}
	return "module " + a.Module
}

func newModuleCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "module", Short: "Upload and list wasm agent modules"}
	cmd.AddCommand(&cobra.Command{
		Use: "upload FILE.wasm", Short: "Upload a wasm module; prints its digest", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := c.upload(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) { fmt.Fprintln(w, m.Digest) })
		},
	}, &cobra.Command{
		Use: "list", Short: "List modules", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out struct {
				Modules []module `json:"modules"`
			}
			if err := c.json(cmd.Context(), "GET", "/v1/modules", nil, &out); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) {
				fmt.Fprintln(w, "DIGEST\tSIZE\tABI\tCREATED")
				for _, m := range out.Modules {
					fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", m.Digest, m.Size, m.ABIVersion, m.CreatedAt.Format(time.RFC3339))
				}
			})
		},
	})
	return cmd
}

func newAgentCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "agent", Short: "Register, update and list agents"}
	var moduleRef, pluginName, policy string
	create := &cobra.Command{
		Use: "create NAME (--module DIGEST|FILE.wasm | --plugin NAME)", Short: "Register an agent bound to a wasm module or a plugin worker", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var a agent
			in := map[string]string{"name": args[0]}
			if pluginName != "" {
				in["plugin"] = pluginName
			} else {
				digest, err := c.moduleDigest(cmd.Context(), moduleRef)
				if err != nil {
					return err
				}
				in["module"] = digest
			}
			if policy != "" {
				in["crash_policy"] = policy
			}
			if err := c.json(cmd.Context(), "POST", "/v1/agents", in, &a); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) {
				fmt.Fprintf(w, "agent %s registered (%s, crash policy %s)\n", a.Name, a.runs(), a.CrashPolicy)
			})
		},
	}
	create.Flags().StringVar(&moduleRef, "module", "", "module digest (sha256:…) or a .wasm file to upload")
	create.Flags().StringVar(&pluginName, "plugin", "", "a registered plugin worker (instead of --module)")
	create.Flags().StringVar(&policy, "crash-policy", "", "restart, sleep or destroy (default: the host's)")
	create.MarkFlagsOneRequired("module", "plugin")
	create.MarkFlagsMutuallyExclusive("module", "plugin")
	list := &cobra.Command{
		Use: "list", Short: "List agents", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out struct {
				Agents []agent `json:"agents"`
			}
			if err := c.json(cmd.Context(), "GET", "/v1/agents", nil, &out); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tKIND\tCRASH POLICY\tRUNS")
				for _, a := range out.Agents {
					runs := a.Module
					if a.Plugin != "" {
						runs = a.Plugin
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", a.Name, a.Kind, a.CrashPolicy, runs)
				}
			})
		},
	}
	var upModule, upPlugin, upPolicy string
	update := &cobra.Command{
		Use: "update NAME (--module DIGEST|FILE.wasm | --plugin NAME)", Short: "Re-bind an agent: new events run the new module or plugin", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := map[string]string{}
			if upPlugin != "" {
				in["plugin"] = upPlugin
			} else {
				digest, err := c.moduleDigest(cmd.Context(), upModule)
				if err != nil {
					return err
				}
				in["module"] = digest
			}
			if upPolicy != "" {
				in["crash_policy"] = upPolicy
			}
			var a agent
			if err := c.json(cmd.Context(), "PUT", "/v1/agents/"+url.PathEscape(args[0]), in, &a); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) {
				fmt.Fprintf(w, "agent %s now runs %s (crash policy %s); events already started keep their binding\n", a.Name, a.runs(), a.CrashPolicy)
			})
		},
	}
	update.Flags().StringVar(&upModule, "module", "", "module digest (sha256:…) or a .wasm file to upload")
	update.Flags().StringVar(&upPlugin, "plugin", "", "a registered plugin worker")
	update.Flags().StringVar(&upPolicy, "crash-policy", "", "restart, sleep or destroy (default: unchanged)")
	update.MarkFlagsOneRequired("module", "plugin")
	update.MarkFlagsMutuallyExclusive("module", "plugin")
	cmd.AddCommand(create, list, update)
	return cmd
}

func newPluginCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "plugin", Short: "Register and list plugin workers (out-of-process agents)"}
	var path, sum string
	var env []string
	var processes int
	register := &cobra.Command{
		Use: "register NAME --path BINARY [--sha256 HEX]", Short: "Register a plugin worker binary on the host", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sum == "" {
				// The binary is on this machine: checksum it here (the host
				// checks it again at every start).
				b, err := os.ReadFile(path)
				if err != nil {
					return fmt.Errorf("--sha256 not given and the binary cannot be read to compute it: %w", err)
				}
				h := sha256.Sum256(b)
				sum = hex.EncodeToString(h[:])
			}
			in := map[string]any{"name": args[0], "path": path, "sha256": sum}
			if processes > 0 {
				in["processes"] = processes
			}
			if len(env) > 0 {
				m := map[string]string{}
				for _, kv := range env {
					k, v, ok := strings.Cut(kv, "=")
					if !ok {
						return fmt.Errorf("--env %q: want KEY=VALUE", kv)
					}
					m[k] = v
				}
				in["env"] = m
			}
			var out map[string]any
			if err := c.json(cmd.Context(), "POST", "/v1/plugins", in, &out); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) {
				fmt.Fprintf(w, "plugin %v registered (%v, sha256 %v)\n", out["name"], out["path"], out["sha256"])
			})
		},
	}
	register.Flags().StringVar(&path, "path", "", "the plugin binary (absolute, or relative to the host's working directory)")
	register.Flags().StringVar(&sum, "sha256", "", "the binary's sha256 (default: computed from --path here)")
	register.Flags().StringArrayVar(&env, "env", nil, "KEY=VALUE for the plugin's environment (repeatable; it inherits nothing else)")
	register.Flags().IntVar(&processes, "processes", 0, "plugin processes serving its sessions (default 1)")
	_ = register.MarkFlagRequired("path")
	list := &cobra.Command{
		Use: "list", Short: "List plugin workers", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out struct {
				Plugins []struct {
					Name      string `json:"name"`
					Path      string `json:"path"`
					SHA256    string `json:"sha256"`
					Processes int    `json:"processes"`
				} `json:"plugins"`
			}
			if err := c.json(cmd.Context(), "GET", "/v1/plugins", nil, &out); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tPROCESSES\tSHA256\tPATH")
				for _, p := range out.Plugins {
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", p.Name, p.Processes, p.SHA256[:min(12, len(p.SHA256))], p.Path)
				}
			})
		},
	}
	cmd.AddCommand(register, list)
	return cmd
}

func sessionPath(agentName, id string) string {
	return "/v1/agents/" + url.PathEscape(agentName) + "/sessions/" + url.PathEscape(id)
}

func printSession(w io.Writer, s session) {
	fmt.Fprintf(w, "session\t%s\n", s.SessionID)
	if s.Key != "" {
		fmt.Fprintf(w, "key\t%s\n", s.Key)
	}
	status := s.Status
	switch {
	case s.SleepTS != nil:
		status += fmt.Sprintf(" since %s (reason: %s; a signal or `session wake` resumes it)", s.SleepTS.Local().Format(time.DateTime), s.SleepReason)
	case s.DestroyTS != nil:
		status += " at " + s.DestroyTS.Local().Format(time.DateTime)
	case s.PendingSince != nil:
		status += " (waiting for pool capacity since " + s.PendingSince.Local().Format(time.TimeOnly) + ")"
	}
	fmt.Fprintf(w, "agent\t%s\nstatus\t%s\ncrash policy\t%s\nepoch\t%d\nturns\t%d\nevents\t%d (%d open, %d dead-lettered)\n",
		s.Agent, status, s.CrashPolicy, s.ActorEpoch, s.TurnCount, s.EventCount, s.OpenEvents, s.DeadLetters)
}

func newSessionCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "session", Short: "Create, get, list, destroy and wake sessions"}
	var key, input, policy string
	var getOrCreate bool
	create := &cobra.Command{
		Use: "create AGENT", Short: "Create a session (prints its id)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := map[string]any{}
			if key != "" {
				in["key"] = key
			}
			if input != "" {
				in["input"] = []byte(input)
			}
			if policy != "" {
				in["crash_policy"] = policy
			}
			method := "POST"
			if getOrCreate {
				method = "PUT"
			}
			var s session
			if err := c.json(cmd.Context(), method, "/v1/agents/"+url.PathEscape(args[0])+"/sessions", in, &s); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) { fmt.Fprintln(w, s.SessionID) })
		},
	}
	create.Flags().StringVar(&key, "key", "", "client-chosen session key, unique per agent")
	create.Flags().BoolVar(&getOrCreate, "get-or-create", false, "return the session with --key if it exists")
	create.Flags().StringVar(&input, "input", "", "input given to the agent with every turn")
	create.Flags().StringVar(&policy, "crash-policy", "", "restart, sleep or destroy (default: the agent's)")
	get := &cobra.Command{
		Use: "get AGENT SESSION", Short: "Show a session", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s session
			if err := c.json(cmd.Context(), "GET", sessionPath(args[0], args[1]), nil, &s); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) { printSession(w, s) })
		},
	}
	list := &cobra.Command{
		Use: "list AGENT", Short: "List an agent's sessions", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var all []session
			cursor := ""
			for {
				var out struct {
					Sessions   []session `json:"sessions"`
					NextCursor string    `json:"next_cursor"`
				}
				path := "/v1/agents/" + url.PathEscape(args[0]) + "/sessions?limit=500&cursor=" + url.QueryEscape(cursor)
				if err := c.json(cmd.Context(), "GET", path, nil, &out); err != nil {
					return err
				}
				all = append(all, out.Sessions...)
				if out.NextCursor == "" {
					break
				}
				cursor = out.NextCursor
			}
			return c.print(cmd, map[string]any{"sessions": all}, func(w io.Writer) {
				fmt.Fprintln(w, "SESSION\tKEY\tSTATUS\tTURNS\tOPEN\tEPOCH")
				for _, s := range all {
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\n", s.SessionID, s.Key, s.Status, s.TurnCount, s.OpenEvents, s.ActorEpoch)
				}
			})
		},
	}
	destroy := &cobra.Command{
		Use: "destroy AGENT SESSION", Short: "Destroy a session: open events are discarded, later signals get 410", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s session
			if err := c.json(cmd.Context(), "DELETE", sessionPath(args[0], args[1]), nil, &s); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) { printSession(w, s) })
		},
	}
	wake := &cobra.Command{
		Use: "wake AGENT SESSION", Short: "Wake a sleeping session", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out map[string]any
			if err := c.json(cmd.Context(), "POST", sessionPath(args[0], args[1])+"/signals", map[string]any{"kind": "wake"}, &out); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) { fmt.Fprintf(w, "session is %v\n", out["status"]) })
		},
	}
	cmd.AddCommand(create, get, list, destroy, wake)
	return cmd
}

func newSignalCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "signal", Short: "Send a session signals: a message, a steer or a cancel"}
	var idem, data, kind string
	var force, wait bool
	var waitFor time.Duration
	send := &cobra.Command{
		Use: "send AGENT SESSION MESSAGE", Short: "Send a message; prints the accepted event id", Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := map[string]any{"message": args[2], "kind": kind}
			if force {
				in["force_allocation"] = true
			}
			if idem != "" {
				in["idempotency_key"] = idem
			}
			if data != "" {
				if !json.Valid([]byte(data)) {
					return fmt.Errorf("--data is not valid JSON")
				}
				in["data"] = json.RawMessage(data)
			}
			var out struct {
				Kind     string `json:"kind"`
				EventID  int64  `json:"event_id"`
				Seq      int64  `json:"seq"`
				Status   string `json:"status"`
				Created  bool   `json:"created"`
				InFlight bool   `json:"in_flight"`
			}
			var before session
			if wait && kind == "message" {
				if err := c.json(cmd.Context(), "GET", sessionPath(args[0], args[1]), nil, &before); err != nil {
					return err
				}
			}
			if err := c.json(cmd.Context(), "POST", sessionPath(args[0], args[1])+"/signals", in, &out); err != nil {
				return err
			}
			if wait && kind == "message" {
				ctx, cancel := context.WithTimeout(cmd.Context(), waitFor)
				defer cancel()
				cmd.SetContext(ctx)
				err := c.waitTurn(cmd, args[0], args[1], out.EventID, before.TurnCount)
				if ctx.Err() == context.DeadlineExceeded {
					return fmt.Errorf("event %d accepted, but its turn did not commit within %s (see `paddock events %s %s`: a failing turn is retried with backoff; a remote pool needs a connected worker)", out.EventID, waitFor, args[0], args[1])
				}
				return err
			}
			return c.print(cmd, out, func(w io.Writer) {
				if out.Created && out.Kind == "steer" && out.InFlight {
					fmt.Fprintf(w, "steer %d handed to the turn in flight (seq %d)\n", out.EventID, out.Seq)
				} else if out.Created {
					fmt.Fprintf(w, "event %d accepted (seq %d)\n", out.EventID, out.Seq)
				} else {
					fmt.Fprintf(w, "event %d already accepted with this idempotency key (seq %d, %s)\n", out.EventID, out.Seq, out.Status)
				}
			})
		},
	}
	send.Flags().StringVar(&idem, "idempotency-key", "", "a re-send with the same key returns the first event")
	send.Flags().StringVar(&data, "data", "", "JSON given to the agent with the message")
	send.Flags().StringVar(&kind, "kind", "message", "message or steer")
	send.Flags().BoolVar(&force, "force-allocation", false, "wait for capacity even if the session's crash policy is sleep")
	send.Flags().BoolVarP(&wait, "wait", "w", false, "wait until the event's turn commits (or the event ends otherwise) and print the reply")
	send.Flags().DurationVar(&waitFor, "wait-timeout", 2*time.Minute, "give up waiting after this long (the event stays accepted)")
	steer := &cobra.Command{
		Use: "steer AGENT SESSION MESSAGE", Short: "Steer the turn in flight (queued like a message if none runs)", Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind = "steer"
			return send.RunE(cmd, args)
		},
	}
	var eventID int64
	cancel := &cobra.Command{
		Use: "cancel AGENT SESSION", Short: "Cancel the turn in flight, or a queued event with --event", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := map[string]any{"kind": "cancel"}
			if eventID != 0 {
				in["event_id"] = eventID
			}
			var out map[string]any
			if err := c.json(cmd.Context(), "POST", sessionPath(args[0], args[1])+"/signals", in, &out); err != nil {
				return err
			}
			return c.print(cmd, out, func(w io.Writer) {
				fmt.Fprintf(w, "event %v cancelled (in flight: %v)\n", out["event_id"], out["in_flight"])
			})
		},
	}
	cancel.Flags().Int64Var(&eventID, "event", 0, "a queued event id to cancel")
	cmd.AddCommand(send, steer, cancel)
	return cmd
}

// waitTurn waits until event id of the session is closed and prints the
// turn that handled it (found after turn number after), or how it ended.
func (c *client) waitTurn(cmd *cobra.Command, agentName, sess string, id, after int64) error {
	var ev struct {
		Status    string `json:"status"`
		LastError string `json:"last_error"`
	}
	for {
		if err := c.json(cmd.Context(), "GET", fmt.Sprintf("%s/events/%d", sessionPath(agentName, sess), id), nil, &ev); err != nil {
			return err
		}
		if ev.Status != "open" {
			break
		}
		select {
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if ev.Status != "done" {
		return fmt.Errorf("event %d ended %s: %s", id, ev.Status, oneLine(ev.LastError, 300))
	}
	for _, from := range []int64{after, 0} {
		var out struct {
			Turns []turn `json:"turns"`
		}
		if err := c.json(cmd.Context(), "GET", fmt.Sprintf("%s/transcript?after=%d&limit=1000", sessionPath(agentName, sess), from), nil, &out); err != nil {
			return err
		}
		for _, t := range out.Turns {
			if t.EventID != id {
				continue
			}
			if c.output == "json" {
				return c.print(cmd, t, nil)
			}
			for _, m := range t.Messages[1:] {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", m.Role, m.Content)
			}
			return nil
		}
	}
	return fmt.Errorf("event %d is done but its turn is not in the transcript", id)
}

type turn struct {
	TurnNo      int64     `json:"turn_no"`
	EventID     int64     `json:"actor_event_id"`
	ActorEpoch  int64     `json:"actor_epoch"`
	Outcome     string    `json:"outcome"`
	CommittedAt time.Time `json:"committed_at"`
	Messages    []struct {
		Index   int    `json:"index"`
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
}

func newTranscriptCmd(c *client) *cobra.Command {
	var follow bool
	var after int64
	cmd := &cobra.Command{
		Use: "transcript AGENT SESSION", Short: "Print a session's transcript (--follow waits for new turns)", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			enc := json.NewEncoder(cmd.OutOrStdout())
			for {
				wait := ""
				if follow {
					wait = "&wait=30s"
				}
				var out struct {
					Turns     []turn `json:"turns"`
					NextAfter int64  `json:"next_after"`
				}
				path := fmt.Sprintf("%s/transcript?after=%d&limit=1000%s", sessionPath(args[0], args[1]), after, wait)
				if err := c.json(cmd.Context(), "GET", path, nil, &out); err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					var ae *apiError
					if !follow || errors.As(err, &ae) {
						return err
					}
					// --follow outlives host restarts: retry the connection.
					fmt.Fprintf(cmd.ErrOrStderr(), "paddock: %v; retrying\n", err)
					select {
					case <-cmd.Context().Done():
						return nil
					case <-time.After(time.Second):
					}
					continue
				}
				for _, t := range out.Turns {
					if c.output == "json" {
						if err := enc.Encode(t); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "── turn %d (event %d, epoch %d, %s) %s\n", t.TurnNo, t.EventID, t.ActorEpoch, t.Outcome, t.CommittedAt.Local().Format(time.TimeOnly))
					for _, m := range t.Messages {
						fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", m.Role, m.Content)
					}
				}
				after = out.NextAfter
				if !follow && len(out.Turns) < 1000 {
					return nil
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep waiting for new turns")
	cmd.Flags().Int64Var(&after, "after", 0, "print turns after this turn number")
	return cmd
}

func newEventsCmd(c *client) *cobra.Command {
	var status string
	cmd := &cobra.Command{
		Use: "events AGENT SESSION", Short: "List a session's actor events", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out struct {
				Events []struct {
					ID        int64           `json:"event_id"`
					Seq       int64           `json:"seq"`
					Kind      string          `json:"kind"`
					Payload   json.RawMessage `json:"payload"`
					Status    string          `json:"status"`
					Attempts  int             `json:"attempts"`
					LastError string          `json:"last_error"`
				} `json:"events"`
			}
			path := sessionPath(args[0], args[1]) + "/events?limit=1000&status=" + url.QueryEscape(status)
			if err := c.json(cmd.Context(), "GET", path, nil, &out); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) {
				fmt.Fprintln(w, "EVENT\tSEQ\tKIND\tSTATUS\tFAILED ATTEMPTS\tPAYLOAD\tLAST ERROR")
				for _, e := range out.Events {
					fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Seq, e.Kind, e.Status, e.Attempts, oneLine(string(e.Payload), 60), lastErrorCell(e.Status, e.LastError))
				}
			})
		},
	}
	cmd.Flags().StringVar(&status, "status", "", "open, done, cancelled, dead_letter or discarded")
	return cmd
}

// lastErrorCell is the LAST ERROR column of `paddock events`. An event
// keeps the error of its last failed attempt after a later attempt
// succeeded: on a done event it is labelled "(earlier attempt)" so that it
// does not read as a failure now.
func lastErrorCell(status, lastError string) string {
	if lastError == "" {
		return ""
	}
	if status == "done" {
		return "(earlier attempt) " + oneLine(lastError, 100)
	}
	return oneLine(lastError, 100)
}

func newEventCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "event", Short: "Show, redrive or discard one event"}
	eventOp := func(use, short, op string) *cobra.Command {
		return &cobra.Command{
			Use: use + " AGENT SESSION EVENT", Short: short, Args: cobra.ExactArgs(3),
			RunE: func(cmd *cobra.Command, args []string) error {
				method, path := "POST", sessionPath(args[0], args[1])+"/events/"+url.PathEscape(args[2])+"/"+op
				if op == "" {
					method, path = "GET", strings.TrimSuffix(path, "/")
				}
				var out map[string]any
				if err := c.json(cmd.Context(), method, path, nil, &out); err != nil {
					return err
				}
				return c.print(cmd, c.raw, func(w io.Writer) {
					fmt.Fprintf(w, "event %v: %v (failed attempts %v)\n", out["event_id"], out["status"], out["attempts"])
					if chain, ok := out["errors"].([]any); ok {
						for _, e := range chain {
							m, _ := e.(map[string]any)
							fmt.Fprintf(w, "  attempt %v (epoch %v, counted %v): %v\n", m["attempt"], m["actor_epoch"], m["counted"],
								strings.ReplaceAll(firstLines(fmt.Sprint(m["error"]), 6), "\n", "\n    "))
						}
					}
				})
			},
		}
	}
	cmd.AddCommand(
		eventOp("show", "Show one event with its error chain", ""),
		eventOp("redrive", "Redrive a dead-lettered event: a new attempt under a new epoch", "redrive"),
		eventOp("discard", "Discard a dead-lettered event", "discard"),
	)
	return cmd
}

func newDeadLettersCmd(c *client) *cobra.Command {
	return &cobra.Command{
		Use: "dead-letters AGENT [SESSION]", Short: "List dead-lettered events with their error chains", Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/v1/agents/" + url.PathEscape(args[0]) + "/dead-letters?limit=1000"
			if len(args) == 2 {
				path = sessionPath(args[0], args[1]) + "/dead-letters?limit=1000"
			}
			var out struct {
				DeadLetters []struct {
					SessionID string `json:"session_id"`
					Event     struct {
						ID        int64  `json:"event_id"`
						Kind      string `json:"kind"`
						Attempts  int    `json:"attempts"`
						LastError string `json:"last_error"`
						Errors    []any  `json:"errors"`
					} `json:"event"`
				} `json:"dead_letters"`
			}
			if err := c.json(cmd.Context(), "GET", path, nil, &out); err != nil {
				return err
			}
			return c.print(cmd, c.raw, func(w io.Writer) {
				fmt.Fprintln(w, "SESSION\tEVENT\tKIND\tATTEMPTS\tLAST ERROR")
				for _, d := range out.DeadLetters {
					fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\n", d.SessionID, d.Event.ID, d.Event.Kind, d.Event.Attempts, oneLine(d.Event.LastError, 100))
				}
			})
		},
	}
}

// oneLine returns the first line of s, cut to n runes, for tables.
func oneLine(s string, n int) string {
	line, _, more := strings.Cut(s, "\n")
	r := []rune(line)
	if len(r) > n {
		return string(r[:n-1]) + "…"
	}
	if more {
		return line + " …"
	}
	return line
}

// firstLines returns the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, "\n")
}
