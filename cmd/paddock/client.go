package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/abi"
	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/store"
)

// client holds the global flags of the client commands.
type client struct {
	server, token, output string
	// namespace is --namespace/-n (env PADDOCK_NAMESPACE): the namespace
	// the client commands act in, sent as ?namespace=. Empty: none is
	// sent, and the API acts in the token's own namespace, else default.
	namespace string
	// maxModule is --max-module-bytes of the commands uploading modules.
	maxModule int64
}

// maxModuleFlag adds --max-module-bytes to cmd, a command that may upload
// a module file.
func (c *client) maxModuleFlag(cmd *cobra.Command) {
	cmd.Flags().Int64Var(&c.maxModule, "max-module-bytes", defaultMaxModuleBytes(),
		"refuse module files over this size before reading them (default: the host's default api.max_module_bytes; 0: no limit here; the host's own limit answers 413)")
}

// api returns the API client for --server, --token and --namespace.
func (c *client) api() *apiclient.Client {
	token := c.token
	if token == "" {
		token = os.Getenv("PADDOCK_TOKEN")
	}
	return apiclient.New(c.server, apiclient.WithToken(token), apiclient.WithNamespace(c.namespace),
		apiclient.WithUserAgent("paddock-cli"))
}

// prog is how the commands the CLI prints for the user to paste start:
// the program as it was invoked (invokedAs), with "-n NS" when this
// command named a namespace (-n or PADDOCK_NAMESPACE), so that the pasted
// command acts where this one did.
func (c *client) prog() string {
	if c.namespace == "" {
		return invokedAs()
	}
	return invokedAs() + " -n " + shellArg(c.namespace)
}

// invokedAs is the program as the user invoked it when that was by a path
// to a binary named paddock (bin/paddock, as the README runs it), so a
// printed command pastes as it is; otherwise "paddock".
func invokedAs() string {
	if a := os.Args[0]; strings.ContainsRune(a, filepath.Separator) && filepath.Base(a) == "paddock" {
		return shellArg(a)
	}
	return "paddock"
}

// reach names the server when the API could not be reached at all (or
// says what is wrong with --server when it is not an http(s) URL); API
// errors and others are returned as they are.
func (c *client) reach(err error) error {
	var ue *url.Error
	if err != nil && apiclient.AsError(err) == nil && errors.As(err, &ue) {
		if u, perr := url.Parse(c.server); perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--server %q (or PADDOCK_SERVER): want the API's URL, such as http://127.0.0.1:8080", c.server)
		}
		return fmt.Errorf("cannot reach the Paddock API at %s (is `paddock serve` running there? --server or PADDOCK_SERVER names another address): %w", c.server, ue)
	}
	return err
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
func runs(a apiclient.Agent) string {
	if a.Plugin != "" {
		return "plugin " + a.Plugin
	}
	return "module " + a.Module
}

func newModuleCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "module", Short: "Upload and list wasm agent modules"}
	upload := &cobra.Command{
		Use: "upload FILE.wasm", Short: "Upload a wasm module; prints its digest", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			m, err := c.upload(cmd.Context(), args[0], apiclient.Raw(&raw))
			if err != nil {
				return err
			}
			return c.print(cmd, raw, func(w io.Writer) { fmt.Fprintln(w, m.Digest) })
		},
	}
	c.maxModuleFlag(upload)
	cmd.AddCommand(upload, &cobra.Command{
		Use: "list", Short: "List modules", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var raw json.RawMessage
			ms, err := c.api().ListModules(cmd.Context(), apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintln(w, "DIGEST\tSIZE\tABI\tCREATED")
				for _, m := range ms {
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
			in := apiclient.CreateAgentRequest{Name: args[0], Plugin: pluginName, CrashPolicy: policy}
			if pluginName == "" {
				digest, err := c.moduleDigest(cmd.Context(), moduleRef)
				if err != nil {
					return err
				}
				in.Module = digest
			}
			var raw json.RawMessage
			a, err := c.api().CreateAgent(cmd.Context(), in, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintf(w, "agent %s registered (%s, crash policy %s)\n", a.Name, runs(a), a.CrashPolicy)
			})
		},
	}
	create.Flags().StringVar(&moduleRef, "module", "", "module digest (sha256:…) or a .wasm file to upload")
	create.Flags().StringVar(&pluginName, "plugin", "", "a registered plugin worker (instead of --module)")
	create.Flags().StringVar(&policy, "crash-policy", "", "restart, sleep or destroy (default: the host's)")
	c.maxModuleFlag(create)
	create.MarkFlagsOneRequired("module", "plugin")
	create.MarkFlagsMutuallyExclusive("module", "plugin")
	list := &cobra.Command{
		Use: "list", Short: "List agents", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var raw json.RawMessage
			as, err := c.api().ListAgents(cmd.Context(), apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tKIND\tCRASH POLICY\tRUNS")
				for _, a := range as {
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
			in := apiclient.UpdateAgentRequest{Plugin: upPlugin, CrashPolicy: upPolicy}
			if upPlugin == "" {
				digest, err := c.moduleDigest(cmd.Context(), upModule)
				if err != nil {
					return err
				}
				in.Module = digest
			}
			var raw json.RawMessage
			a, err := c.api().UpdateAgent(cmd.Context(), args[0], in, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintf(w, "agent %s now runs %s (crash policy %s); events already started keep their binding\n", a.Name, runs(a), a.CrashPolicy)
			})
		},
	}
	update.Flags().StringVar(&upModule, "module", "", "module digest (sha256:…) or a .wasm file to upload")
	update.Flags().StringVar(&upPlugin, "plugin", "", "a registered plugin worker")
	update.Flags().StringVar(&upPolicy, "crash-policy", "", "restart, sleep or destroy (default: unchanged)")
	c.maxModuleFlag(update)
	update.MarkFlagsOneRequired("module", "plugin")
	update.MarkFlagsMutuallyExclusive("module", "plugin")
	show := &cobra.Command{
		Use: "show NAME", Short: "Show an agent with its host-call capabilities", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			a, err := c.api().GetAgent(cmd.Context(), args[0], apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) { printAgent(w, a) })
		},
	}
	cmd.AddCommand(create, list, update, show)
	return cmd
}

// printAgent prints agent a and its capabilities for `agent show`. Names
// and rules come from the host's config and the API, not from agents, but
// are escaped like any text from the server.
func printAgent(w io.Writer, a apiclient.Agent) {
	fmt.Fprintf(w, "agent\t%s\nuid\t%s\nruns\t%s\ncrash policy\t%s\ncreated\t%s\nupdated\t%s\n",
		safeCell(a.Name), a.UID, safeCell(runs(a)), a.CrashPolicy, a.CreatedAt.Local().Format(time.DateTime), a.UpdatedAt.Local().Format(time.DateTime))
	caps := a.Capabilities
	if len(caps.HTTP) == 0 {
		fmt.Fprintln(w, "http\t(none: every http call is denied)")
	}
	for i, r := range caps.HTTP {
		label := ""
		if i == 0 {
			label = "http"
		}
		fmt.Fprintf(w, "%s\t%s\n", label, httpRuleCell(r))
	}
	fmt.Fprintf(w, "models\t%s\n", listCell(caps.Models, "(none: every model call is denied)"))
	fmt.Fprintf(w, "secrets\t%s\n", listCell(caps.Secrets, "(none)"))
	l := caps.Limits
	fmt.Fprintf(w, "limits\tcalls/turn %s, response bytes/turn %s, tokens/turn %s, tokens/day %s\n",
		limitCell(int64(l.CallsPerTurn)), limitCell(l.ResponseBytesPerTurn), limitCell(l.TokensPerTurn), limitCell(l.TokensPerDay))
	ap := caps.Approval
	if len(ap.HTTP) == 0 && len(ap.Models) == 0 {
		fmt.Fprintln(w, "approval	(none: granted calls go out without a decision)")
		return
	}
	label := "approval"
	for _, r := range ap.HTTP {
		methods := "every method"
		if len(r.Methods) > 0 {
			methods = strings.Join(r.Methods, ",")
		}
		path := ""
		if r.PathPrefix != "" {
			path = " path " + r.PathPrefix + "*"
		}
		fmt.Fprintf(w, "%s\t%s\n", label, safeCell("http "+methods+" "+r.Host+path))
		label = ""
	}
	for _, m := range ap.Models {
		fmt.Fprintf(w, "%s\t%s\n", label, safeCell("model "+m))
		label = ""
	}
	timeout := "never (an undecided approval waits for ever)"
	if ap.TimeoutMs > 0 {
		timeout = (time.Duration(ap.TimeoutMs) * time.Millisecond).String()
	}
	fmt.Fprintf(w, "approval ttl\t%s\n", timeout)
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
				var err error
				if sum, err = fileSHA256(path); err != nil {
					return fmt.Errorf("--sha256 not given and the binary cannot be read to compute it: %w", err)
				}
			}
			if processes < 0 {
				return fmt.Errorf("--processes %d: want a positive number of processes (0 or absent: 1)", processes)
			}
			in := apiclient.PluginRegistration{Name: args[0], Path: path, SHA256: sum, Processes: processes}
			if len(env) > 0 {
				in.Env = map[string]string{}
				for _, kv := range env {
					k, v, ok := strings.Cut(kv, "=")
					if !ok {
						return fmt.Errorf("--env %q: want KEY=VALUE", kv)
					}
					in.Env[k] = v
				}
			}
			var raw json.RawMessage
			p, err := c.api().RegisterPlugin(cmd.Context(), in, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintf(w, "plugin %s registered (%s, sha256 %s)\n", p.Name, safeCell(p.Path), p.SHA256)
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
			var raw json.RawMessage
			ps, err := c.api().ListPlugins(cmd.Context(), apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tPROCESSES\tSHA256\tPATH")
				for _, p := range ps {
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", p.Name, p.Processes, p.SHA256[:min(12, len(p.SHA256))], safeCell(p.Path))
				}
			})
		},
	}
	cmd.AddCommand(register, list)
	return cmd
}

// printSession prints a session; prog starts the commands it suggests
// (client.prog).
func printSession(w io.Writer, prog string, s apiclient.Session) {
	fmt.Fprintf(w, "session\t%s\n", s.SessionID)
	if s.Key != "" {
		fmt.Fprintf(w, "key\t%s\n", safeCell(s.Key))
	}
	status := string(s.Status)
	switch {
	case s.Status == store.SessionDestroyed:
		if s.DestroyTS != nil {
			status += " at " + s.DestroyTS.Local().Format(time.DateTime)
		}
		status += " (its transcript stays readable; signals get 410)"
	case s.SleepTS != nil:
		since := s.SleepTS.Local().Format(time.DateTime)
		waits := prog + " wait list " + shellArg(s.Agent) + " " + shellArg(s.SessionID)
		switch s.SleepReason {
		case store.SleepReasonApproval:
			status += fmt.Sprintf(" since %s (waiting for an approval: %s)", since, waits)
		case store.SleepReasonWait:
			status += fmt.Sprintf(" since %s (waiting: %s; resolving the wait resumes it)", since, waits)
		default:
			status += fmt.Sprintf(" since %s (reason: %s; a signal or `session wake` resumes it)", since, safeCell(s.SleepReason))
		}
	case s.PendingSince != nil:
		status += " (waiting for pool capacity since " + s.PendingSince.Local().Format(time.TimeOnly) + ")"
	}
	fmt.Fprintf(w, "agent\t%s\nstatus\t%s\ncrash policy\t%s\nepoch\t%d\nturns\t%d\nevents\t%d (%d open, %d dead-lettered)\n",
		s.Agent, status, s.CrashPolicy, s.ActorEpoch, s.TurnCount, s.EventCount, s.OpenEvents, s.DeadLetters)
}

// listedSession is a session as `session list --output json` prints it:
// these fields in this order (the listing is assembled from several pages,
// so it is not one server body).
type listedSession struct {
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

func toListedSession(s apiclient.Session) listedSession {
	return listedSession{Agent: s.Agent, SessionID: s.SessionID, Key: s.Key, Status: string(s.Status), CrashPolicy: string(s.CrashPolicy),
		ActorEpoch: s.ActorEpoch, TurnCount: s.TurnCount, EventCount: s.EventCount, OpenEvents: s.OpenEvents, DeadLetters: s.DeadLetters,
		SleepTS: s.SleepTS, SleepReason: s.SleepReason, DestroyTS: s.DestroyTS, PendingSince: s.PendingSince}
}

func newSessionCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "session", Short: "Create, get, list, destroy and wake sessions"}
	var key, input, policy string
	var getOrCreate bool
	create := &cobra.Command{
		Use: "create AGENT", Short: "Create a session (prints its id)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := apiclient.SessionRequest{Key: key, CrashPolicy: policy}
			if input != "" {
				in.Input = []byte(input)
			}
			create := c.api().CreateSession
			if getOrCreate {
				create = c.api().GetOrCreateSession
			}
			var raw json.RawMessage
			s, err := create(cmd.Context(), args[0], in, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) { fmt.Fprintln(w, s.SessionID) })
		},
	}
	create.Flags().StringVar(&key, "key", "", "client-chosen session key, unique per agent")
	create.Flags().BoolVar(&getOrCreate, "get-or-create", false, "return the session with --key if it exists")
	create.Flags().StringVar(&input, "input", "", "input given to the agent with every turn")
	create.Flags().StringVar(&policy, "crash-policy", "", "restart, sleep or destroy (default: the agent's)")
	get := &cobra.Command{
		Use: "get AGENT SESSION", Short: "Show a session", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			s, err := c.api().GetSession(cmd.Context(), args[0], args[1], apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) { printSession(w, c.prog(), s) })
		},
	}
	list := &cobra.Command{
		Use: "list AGENT", Short: "List an agent's sessions", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var all []listedSession
			for cursor := ""; ; {
				page, err := c.api().ListSessions(cmd.Context(), args[0], apiclient.ListSessionsOptions{Limit: 500, Cursor: cursor})
				if err != nil {
					return c.reach(err)
				}
				for _, s := range page.Sessions {
					all = append(all, toListedSession(s))
				}
				if page.NextCursor == "" {
					break
				}
				cursor = page.NextCursor
			}
			return c.print(cmd, map[string]any{"sessions": all}, func(w io.Writer) {
				fmt.Fprintln(w, "SESSION\tKEY\tSTATUS\tTURNS\tOPEN\tEPOCH")
				for _, s := range all {
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\n", s.SessionID, safeCell(s.Key), s.Status, s.TurnCount, s.OpenEvents, s.ActorEpoch)
				}
			})
		},
	}
	destroy := &cobra.Command{
		Use: "destroy AGENT SESSION", Short: "Destroy a session: open events are discarded, later signals get 410", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			s, err := c.api().DestroySession(cmd.Context(), args[0], args[1], apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) { printSession(w, c.prog(), s) })
		},
	}
	wake := &cobra.Command{
		Use: "wake AGENT SESSION", Short: "Wake a sleeping session", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			out, err := c.api().SendSignal(cmd.Context(), args[0], args[1], apiclient.Signal{Kind: apiclient.SignalWake}, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) { fmt.Fprintf(w, "session is %s\n", out.Status) })
		},
	}
	cmd.AddCommand(create, get, list, destroy, wake, newSessionStreamCmd(c))
	return cmd
}

func newSignalCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "signal", Short: "Send a session signals: a message, a steer or a cancel"}
	var idem, data, kind, midTurn string
	var force, wait, follow bool
	var waitFor time.Duration
	send := &cobra.Command{
		Use: "send AGENT SESSION MESSAGE", Short: "Send a message; prints the accepted event id", Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Checked before the send: refused after it, a retry would send
			// the signal twice (found in review).
			if waitFor < 0 || (waitFor == 0 && wait) {
				return fmt.Errorf("--wait-timeout %s: want a positive duration (0 only with --stream: never give up)", waitFor)
			}
			in := apiclient.Signal{Kind: kind, Message: args[2], IdempotencyKey: idem, ForceAllocation: force, MidTurn: midTurn}
			if data != "" {
				if err := checkDataFlag(data); err != nil {
					return err
				}
				in.Data = json.RawMessage(data)
			}
			api := c.api()
			var before apiclient.Session
			if wait && kind == "message" {
				var err error
				if before, err = api.GetSession(cmd.Context(), args[0], args[1]); err != nil {
					return c.reach(err)
				}
			}
			var es *apiclient.EventStream
			if follow {
				// Subscribed before the send: the turn's frames all come
				// after this stream's start.
				var err error
				if es, err = api.Stream(cmd.Context(), args[0], args[1], "head"); err != nil {
					return c.reach(err)
				}
				defer es.Close()
			}
			out, err := api.SendSignal(cmd.Context(), args[0], args[1], in)
			if err != nil {
				return c.reach(err)
			}
			if follow {
				id, err := turnOf(cmd.Context(), api, args[0], args[1], out)
				if err != nil {
					return c.reach(err)
				}
				return c.streamTurn(cmd, args[0], args[1], id, es, c.output == "json", waitFor)
			}
			if wait && kind == "message" {
				ctx, cancel := context.WithTimeout(cmd.Context(), waitFor)
				defer cancel()
				cmd.SetContext(ctx)
				err := c.waitTurn(cmd, args[0], args[1], out.EventID, before.TurnCount)
				if ctx.Err() == context.DeadlineExceeded {
					return fmt.Errorf("event %d accepted, but its turn did not commit within %s (see `%s events %s %s`: a failing turn is retried with backoff; a remote pool needs a connected worker)", out.EventID, waitFor, c.prog(), shellArg(args[0]), shellArg(args[1]))
				}
				return err
			}
			return c.print(cmd, out, func(w io.Writer) {
				switch {
				case out.Created && out.Kind == "steer" && out.InFlight,
					out.Created && out.MidTurn == apiclient.MidTurnSteer && out.InFlight:
					fmt.Fprintf(w, "steer %d handed to the turn in flight (seq %d)\n", out.EventID, out.Seq)
				case out.Created && (out.Kind == "steer" || out.MidTurn == apiclient.MidTurnSteer):
					// No turn was in flight yet (a new turn counts as in
					// flight a moment after its signal: runtime.promote_after).
					fmt.Fprintf(w, "event %d accepted (seq %d): no turn in flight to steer, so it waits as the session's next message\n", out.EventID, out.Seq)
				case out.Created && out.InterruptedEventID != 0:
					fmt.Fprintf(w, "event %d accepted (seq %d); the turn of event %d was cancelled\n", out.EventID, out.Seq, out.InterruptedEventID)
				case out.Created:
					fmt.Fprintf(w, "event %d accepted (seq %d)\n", out.EventID, out.Seq)
				default:
					fmt.Fprintf(w, "event %d already accepted with this idempotency key (seq %d, %s)\n", out.EventID, out.Seq, out.Status)
				}
			})
		},
	}
	send.Flags().StringVar(&idem, "idempotency-key", "", "a re-send with the same key returns the first event")
	send.Flags().StringVar(&data, "data", "", "JSON given to the agent with the message")
	send.Flags().StringVar(&kind, "kind", "message", "message or steer")
	send.Flags().StringVar(&midTurn, "mid-turn", "", "what the message does if a turn is in flight: queue, steer, interrupt or reject (default: the agent's policy.mid_turn)")
	send.Flags().BoolVar(&force, "force-allocation", false, "wait for capacity even if the session's crash policy is sleep")
	send.Flags().BoolVarP(&wait, "wait", "w", false, "wait until the event's turn commits (or the event ends otherwise) and print the reply")
	send.Flags().DurationVar(&waitFor, "wait-timeout", 2*time.Minute, "with --wait or --stream: give up waiting after this long, exit 1 (the event stays accepted; 0: never with --stream)")
	send.Flags().BoolVar(&follow, "stream", false, "follow the session's stream until the sent message's turn commits (exit 0; an outcome wait prints the wait's resolve command), fails (exit 1) or is held for an approval (exit 3)")
	send.MarkFlagsMutuallyExclusive("wait", "stream")
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
			var raw json.RawMessage
			out, err := c.api().SendSignal(cmd.Context(), args[0], args[1], apiclient.Signal{Kind: apiclient.SignalCancel, EventID: eventID}, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			// The server's body, re-encoded: its keys sorted, as printed
			// since the first release.
			var body map[string]any
			if err := json.Unmarshal(raw, &body); err != nil {
				return err
			}
			return c.print(cmd, body, func(w io.Writer) {
				fmt.Fprintf(w, "event %d cancelled (in flight: %v)\n", out.EventID, out.InFlight)
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
	api := c.api()
	var ev apiclient.Event
	for {
		var err error
		if ev, err = api.GetEvent(cmd.Context(), agentName, sess, id); err != nil {
			return c.reach(err)
		}
		if ev.Status != store.EventOpen {
			break
		}
		select {
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if ev.Status != store.EventDone {
		return eventEnded(cmd.Context(), api, agentName, sess, ev)
	}
	turnOf := id
	if ev.SteerOf != 0 {
		// A message handed to a running turn (--mid-turn steer) committed
		// with that turn.
		turnOf = ev.SteerOf
	}
	for _, from := range []int64{after, 0} {
		page, err := api.Transcript(cmd.Context(), agentName, sess, apiclient.TranscriptOptions{After: from, Limit: 1000})
		if err != nil {
			return c.reach(err)
		}
		for _, t := range page.Turns {
			if t.EventID != turnOf {
				continue
			}
			if c.output == "json" {
				return c.print(cmd, toPrintedTurn(t), nil)
			}
			for _, m := range t.Messages[1:] {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", safeCell(m.Role), safeText(m.Content))
			}
			return nil
		}
	}
	return fmt.Errorf("event %d is done but its turn is not in the transcript", id)
}

// usageNote is ", tokens N in / M out" for a turn header, "" when the
// turn used no model tokens.
func usageNote(u abi.Usage) string {
	if u.InputTokens == 0 && u.OutputTokens == 0 {
		return ""
	}
	return fmt.Sprintf(", tokens %d in / %d out", u.InputTokens, u.OutputTokens)
}

// printedTurn is a turn as --output json prints it: these fields in this
// order; usage only when the turn used model tokens.
type printedTurn struct {
	TurnNo      int64                     `json:"turn_no"`
	EventID     int64                     `json:"actor_event_id"`
	ActorEpoch  int64                     `json:"actor_epoch"`
	Outcome     string                    `json:"outcome"`
	CommittedAt time.Time                 `json:"committed_at"`
	Messages    []store.TranscriptMessage `json:"messages"`
	Usage       *abi.Usage                `json:"usage,omitempty"`
}

func toPrintedTurn(t store.Turn) printedTurn {
	p := printedTurn{TurnNo: t.TurnNo, EventID: t.EventID, ActorEpoch: t.ActorEpoch, Outcome: string(t.Outcome),
		CommittedAt: t.CommittedAt, Messages: t.Messages}
	if t.Usage != (abi.Usage{}) {
		u := t.Usage
		p.Usage = &u
	}
	return p
}

func newTranscriptCmd(c *client) *cobra.Command {
	var follow bool
	var after int64
	cmd := &cobra.Command{
		Use: "transcript AGENT SESSION", Short: "Print a session's transcript (--follow waits for new turns)", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			enc := json.NewEncoder(cmd.OutOrStdout())
			api := c.api()
			printed := 0
			for {
				o := apiclient.TranscriptOptions{After: after, Limit: 1000}
				if follow {
					o.Wait = 30 * time.Second
				}
				out, err := api.Transcript(cmd.Context(), args[0], args[1], o)
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					if follow && apiclient.IsCode(err, apiclient.CodeSessionDestroyed) {
						return ErrSessionDestroyed // as session stream ends
					}
					err = c.reach(err)
					if !follow || apiclient.AsError(err) != nil {
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
						if err := enc.Encode(toPrintedTurn(t)); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "── turn %d (event %d, epoch %d, %s%s) %s\n", t.TurnNo, t.EventID, t.ActorEpoch, t.Outcome, usageNote(t.Usage), t.CommittedAt.Local().Format(time.TimeOnly))
					for _, m := range t.Messages {
						fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", safeCell(m.Role), safeText(m.Content))
					}
				}
				printed += len(out.Turns)
				after = out.NextAfter
				if !follow && len(out.Turns) < 1000 {
					if printed == 0 && c.output != "json" {
						// Say so rather than print nothing (text output only:
						// --output json stays one turn per line, none here).
						fmt.Fprintln(cmd.OutOrStdout(), "no turns")
					}
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
			var raw json.RawMessage
			evs, err := c.api().ListEvents(cmd.Context(), args[0], args[1], apiclient.ListEventsOptions{Status: store.EventStatus(status), Limit: 1000}, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			// Open events held for an approval: by event id, the wait's id
			// (one page of the session's open approvals; best effort).
			held := map[int64]string{}
			if c.output != "json" {
				if ws, err := c.api().SessionWaits(cmd.Context(), args[0], args[1], apiclient.ListWaitsOptions{Status: store.WaitOpen, Limit: 1000}); err == nil {
					for _, x := range ws.Waits {
						if x.Kind == store.WaitKindApproval {
							held[x.EventID] = x.WaitID
						}
					}
				}
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintln(w, "EVENT\tSEQ\tKIND\tSTATUS\tFAILED ATTEMPTS\tPAYLOAD\tLAST ERROR")
				for _, e := range evs {
					status := string(e.Status)
					if id, ok := held[e.ID]; ok && e.Status == store.EventOpen {
						status += " (held for approval " + safeCell(id) + ")"
					}
					fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Seq, e.Kind, status, e.Attempts, oneLine(string(e.Payload), 60), lastErrorCell(string(e.Status), e.LastError))
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
	var results bool
	show := func(api *apiclient.Client, ctx context.Context, agent, session string, id int64, opts ...apiclient.CallOption) (apiclient.Event, error) {
		return api.GetEventWith(ctx, agent, session, id, apiclient.GetEventOptions{IncludeResults: results}, opts...)
	}
	eventOp := func(use, short string, op func(*apiclient.Client, context.Context, string, string, int64, ...apiclient.CallOption) (apiclient.Event, error)) *cobra.Command {
		return &cobra.Command{
			Use: use + " AGENT SESSION EVENT", Short: short, Args: cobra.ExactArgs(3),
			RunE: func(cmd *cobra.Command, args []string) error {
				id, err := strconv.ParseInt(args[2], 10, 64)
				if err != nil || id < 1 {
					return fmt.Errorf("EVENT %q must be a positive event id", args[2])
				}
				var raw json.RawMessage
				e, err := op(c.api(), cmd.Context(), args[0], args[1], id, apiclient.Raw(&raw))
				if err != nil {
					return c.reach(err)
				}
				return c.print(cmd, raw, func(w io.Writer) {
					fmt.Fprintf(w, "event %d: %s (failed attempts %d)\n", e.ID, e.Status, e.Attempts)
					for _, a := range e.Errors {
						fmt.Fprintf(w, "  attempt %d (epoch %d, %s): %s\n", a.Attempt, a.ActorEpoch, countedText(a.Counted),
							safeText(firstLines(a.Error, 6)))
					}
					printCalls(w, e.Calls)
				})
			},
		}
	}
	showCmd := eventOp("show", "Show one event with its error chain and its host calls", show)
	showCmd.Flags().BoolVar(&results, "results", false, "with --output json: include each host call's recorded result")
	cmd.AddCommand(
		showCmd,
		eventOp("redrive", "Redrive a dead-lettered event: a new attempt under a new epoch", (*apiclient.Client).Redrive),
		eventOp("discard", "Discard a dead-lettered event", (*apiclient.Client).Discard),
	)
	return cmd
}

func newDeadLettersCmd(c *client) *cobra.Command {
	return &cobra.Command{
		Use: "dead-letters AGENT [SESSION]", Short: "List dead-lettered events with their error chains", Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			o := apiclient.DeadLetterOptions{Limit: 1000}
			var dls []apiclient.DeadLetter
			var err error
			if len(args) == 2 {
				dls, err = c.api().SessionDeadLetters(cmd.Context(), args[0], args[1], o, apiclient.Raw(&raw))
			} else {
				dls, err = c.api().AgentDeadLetters(cmd.Context(), args[0], o, apiclient.Raw(&raw))
			}
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintln(w, "SESSION\tEVENT\tKIND\tATTEMPTS\tLAST ERROR")
				for _, d := range dls {
					fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\n", safeCell(d.SessionID), d.Event.ID, d.Event.Kind, d.Event.Attempts, oneLine(d.Event.LastError, 100))
				}
			})
		},
	}
}

// oneLine returns the first line of s, cut to n runes, for tables; its
// controls are escaped (see safeCell).
func oneLine(s string, n int) string {
	line, _, more := strings.Cut(s, "\n")
	r := []rune(line)
	if len(r) > n {
		return safeCell(string(r[:n-1])) + "…"
	}
	if more {
		return safeCell(line) + " …"
	}
	return safeCell(line)
}

// firstLines returns the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, "\n")
}

// countedText says whether a failed attempt counted against the agent's
// max_attempts (docs/DESIGN.md "What counts as an attempt": why one did
// not — never sent, a shutdown, a hold — is its error's to say).
func countedText(counted bool) string {
	if counted {
		return "counted against max_attempts"
	}
	return "not counted against max_attempts"
}
