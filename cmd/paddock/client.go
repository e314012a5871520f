package main

import (
	"bytes"
	"context"
	"encoding/json"
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
	Module      string `json:"module"`
	CrashPolicy string `json:"crash_policy"`
}

type session struct {
	Agent       string `json:"agent"`
	SessionID   string `json:"session_id"`
	Key         string `json:"key"`
	Status      string `json:"status"`
	CrashPolicy string `json:"crash_policy"`
	ActorEpoch  int64  `json:"actor_epoch"`
	TurnCount   int64  `json:"turn_count"`
	EventCount  int64  `json:"event_count"`
	OpenEvents  int64  `json:"open_events"`
	Created     *bool  `json:"created"`
}

func newModuleCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "module", Short: "Upload and list wasm agent modules"}
	cmd.AddCommand(&cobra.Command{
		Use: "upload FILE.wasm", Short: "Upload a wasm module; prints its digest", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			var m module
			if err := c.do(cmd.Context(), "POST", "/v1/modules", bytes.NewReader(b), "application/wasm", &m); err != nil {
				return err
			}
			return c.print(cmd, m, func(w io.Writer) { fmt.Fprintln(w, m.Digest) })
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
			return c.print(cmd, out, func(w io.Writer) {
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
	cmd := &cobra.Command{Use: "agent", Short: "Register and list agents"}
	var moduleRef, policy string
	create := &cobra.Command{
		Use: "create NAME --module DIGEST|FILE.wasm", Short: "Register an agent bound to a module", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			digest := moduleRef
			if strings.HasSuffix(moduleRef, ".wasm") {
				b, err := os.ReadFile(moduleRef)
				if err != nil {
					return err
				}
				var m module
				if err := c.do(cmd.Context(), "POST", "/v1/modules", bytes.NewReader(b), "application/wasm", &m); err != nil {
					return err
				}
				digest = m.Digest
			}
			var a agent
			in := map[string]string{"name": args[0], "module": digest}
			if policy != "" {
				in["crash_policy"] = policy
			}
			if err := c.json(cmd.Context(), "POST", "/v1/agents", in, &a); err != nil {
				return err
			}
			return c.print(cmd, a, func(w io.Writer) {
				fmt.Fprintf(w, "agent %s registered (module %s, crash policy %s)\n", a.Name, a.Module, a.CrashPolicy)
			})
		},
	}
	create.Flags().StringVar(&moduleRef, "module", "", "module digest (sha256:…) or a .wasm file to upload")
	create.Flags().StringVar(&policy, "crash-policy", "", "restart, sleep or destroy (default: the host's)")
	_ = create.MarkFlagRequired("module")
	list := &cobra.Command{
		Use: "list", Short: "List agents", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out struct {
				Agents []agent `json:"agents"`
			}
			if err := c.json(cmd.Context(), "GET", "/v1/agents", nil, &out); err != nil {
				return err
			}
			return c.print(cmd, out, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tCRASH POLICY\tMODULE")
				for _, a := range out.Agents {
					fmt.Fprintf(w, "%s\t%s\t%s\n", a.Name, a.CrashPolicy, a.Module)
				}
			})
		},
	}
	cmd.AddCommand(create, list)
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
	fmt.Fprintf(w, "agent\t%s\nstatus\t%s\ncrash policy\t%s\nepoch\t%d\nturns\t%d\nevents\t%d (%d open)\n",
		s.Agent, s.Status, s.CrashPolicy, s.ActorEpoch, s.TurnCount, s.EventCount, s.OpenEvents)
}

func newSessionCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "session", Short: "Create, get and list sessions"}
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
			return c.print(cmd, s, func(w io.Writer) { fmt.Fprintln(w, s.SessionID) })
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
			return c.print(cmd, s, func(w io.Writer) { printSession(w, s) })
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
	cmd.AddCommand(create, get, list)
	return cmd
}

func newSignalCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "signal", Short: "Send signals to a session"}
	var idem, data string
	send := &cobra.Command{
		Use: "send AGENT SESSION MESSAGE", Short: "Send a message; prints the accepted event id", Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := map[string]any{"message": args[2]}
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
				EventID int64  `json:"event_id"`
				Seq     int64  `json:"seq"`
				Status  string `json:"status"`
				Created bool   `json:"created"`
			}
			if err := c.json(cmd.Context(), "POST", sessionPath(args[0], args[1])+"/signals", in, &out); err != nil {
				return err
			}
			return c.print(cmd, out, func(w io.Writer) {
				if out.Created {
					fmt.Fprintf(w, "event %d accepted (seq %d)\n", out.EventID, out.Seq)
				} else {
					fmt.Fprintf(w, "event %d already accepted with this idempotency key (seq %d, %s)\n", out.EventID, out.Seq, out.Status)
				}
			})
		},
	}
	send.Flags().StringVar(&idem, "idempotency-key", "", "a re-send with the same key returns the first event")
	send.Flags().StringVar(&data, "data", "", "JSON given to the agent with the message")
	cmd.AddCommand(send)
	return cmd
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
					return err
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
			return c.print(cmd, out, func(w io.Writer) {
				fmt.Fprintln(w, "EVENT\tSEQ\tKIND\tSTATUS\tATTEMPTS\tLAST ERROR\tPAYLOAD")
				for _, e := range out.Events {
					fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Seq, e.Kind, e.Status, e.Attempts, e.LastError, e.Payload)
				}
			})
		},
	}
	cmd.Flags().StringVar(&status, "status", "", "open, done, cancelled, dead_letter or discarded")
	return cmd
}
