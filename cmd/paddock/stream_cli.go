package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/abi"
	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/store"
)

// The session stream in the CLI: `session stream` follows a session's
// stream, `signal send --stream` follows the turn of the message it sent.
// Agent text (chunks, messages, errors) is made inert for the terminal as
// everywhere else (termsafe.go): the answer's text is printed indented, so
// that no line of it can pass for one of the CLI's own "[…]" lines.

// reconnectDelay is the wait before reconnecting a dropped stream when the
// server suggested none.
const reconnectDelay = time.Second

// followStream follows a session's stream from position after ("" for the
// oldest kept frame), calling handle with each event; a dropped
// connection is reconnected with the last event's id (Last-Event-ID), so
// handle sees every event once. It returns when handle says done (its
// error), when ctx ends (ctx.Err()), with ErrSessionDestroyed when the
// session is destroyed, or with another API error (unknown session).
func (c *client) followStream(ctx context.Context, stderr io.Writer, agent, sess, after string, handle func(apiclient.StreamEvent) (bool, error)) error {
	return c.followOpened(ctx, stderr, agent, sess, after, nil, handle)
}

// followOpened is followStream on es when it is not nil (a stream opened
// at after), opening the next connections as needed.
func (c *client) followOpened(ctx context.Context, stderr io.Writer, agent, sess, after string, es *apiclient.EventStream, handle func(apiclient.StreamEvent) (bool, error)) error {
	api := c.api()
	last := after
	for {
		var err error
		if es == nil {
			es, err = api.Stream(ctx, agent, sess, last)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if apiclient.IsCode(err, apiclient.CodeSessionDestroyed) {
				return ErrSessionDestroyed
			}
			if apiclient.AsError(err) != nil && !apiclient.IsServerError(err) {
				return err
			}
			fmt.Fprintf(stderr, "paddock: %v; reconnecting in %s\n", c.reach(err), reconnectDelay)
			if !sleepCtx(ctx, reconnectDelay) {
				return ctx.Err()
			}
			continue
		}
		// A stream opened under another context (the caller's) ends with
		// ctx too.
		cur := es
		unhook := context.AfterFunc(ctx, func() { cur.Close() })
		err = c.readStream(ctx, stderr, agent, sess, &last, es, handle)
		unhook()
		if errors.Is(err, errReconnect) {
			es = nil
			continue
		}
		return err
	}
}

// errReconnect: readStream lost the connection and waited; reconnect.
var errReconnect = errors.New("reconnect")

// readStream reads es until handle says done, ctx ends or the connection
// drops (errReconnect, after the server's suggested delay).
func (c *client) readStream(ctx context.Context, stderr io.Writer, agent, sess string, lastp *string, es *apiclient.EventStream, handle func(apiclient.StreamEvent) (bool, error)) error {
	api := c.api()
	last := *lastp
	defer func() { *lastp = last }()
	for {
		ev, err := es.Next()
		if id := es.LastEventID(); id != "" {
			last = id // also where a stream opened at "head" started
		}
		if err != nil {
			es.Close()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The server ends a destroyed session's stream: say so
			// rather than reconnect to a 410.
			if s, gerr := api.GetSession(ctx, agent, sess); apiclient.IsCode(gerr, apiclient.CodeSessionDestroyed) || (gerr == nil && s.Status == store.SessionDestroyed) {
				return ErrSessionDestroyed
			}
			delay := es.Retry()
			if delay <= 0 {
				delay = reconnectDelay
			}
			at := "the start of the stream"
			if last != "" {
				at = "after event id " + last
			}
			fmt.Fprintf(stderr, "paddock: stream dropped (%v); reconnecting in %s, resuming %s\n", err, delay, at)
			if !sleepCtx(ctx, delay) {
				return ctx.Err()
			}
			return errReconnect
		}
		if done, err := handle(ev); done || err != nil {
			es.Close()
			return err
		}
	}
}

// ErrSessionDestroyed ends a followed stream: the session was destroyed.
var ErrSessionDestroyed = errors.New("session destroyed")

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// streamPrinter prints stream events: with json, one JSON object per
// event ({"id","event","data"}); else text chunks inline as they arrive
// and a "[…]" line for each lifecycle event.
type streamPrinter struct {
	w    io.Writer
	json bool
	// open: a line of answer text is open (the next "[…]" line starts a
	// new one).
	open bool
	// texts are the attempts whose text was printed, by (event, attempt).
	texts map[[2]int64]bool
	// prog, agent and session name the stream in the hints printed (the
	// full `paddock [-n NS] wait resolve` command; prog is client.prog).
	prog, agent, session string
}

func newStreamPrinter(w io.Writer, asJSON bool, prog, agent, session string) *streamPrinter {
	return &streamPrinter{w: w, json: asJSON, texts: map[[2]int64]bool{}, prog: prog, agent: agent, session: session}
}

// resolveHint is the full command that resolves a wait of kind kind;
// prog starts it (client.prog: "paddock", or "paddock -n NS").
func resolveHint(prog, agent, session, waitID string, kind store.WaitKind) string {
	cmd := prog + " wait resolve " + shellArg(agent) + " " + shellArg(session) + " " + shellArg(waitID)
	if kind == store.WaitKindApproval {
		return cmd + " --approve   (or --reject --reason TEXT)"
	}
	return cmd + " --data JSON   (e.g. --data '\"yes\"')"
}

// shellArg quotes s for a POSIX shell unless it is made of safe
// characters only; control characters are escaped (safeCell).
func shellArg(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(safeCell(s), "'", `'\''`) + "'"
}

// streamData is the union of the fields of the stream's event data the
// CLI prints.
type streamData struct {
	Seq      int64                     `json:"seq"`
	EventID  int64                     `json:"event_id"`
	Epoch    int64                     `json:"epoch"`
	Attempt  int64                     `json:"attempt"`
	Type     string                    `json:"type"`
	Text     string                    `json:"text"`
	Data     json.RawMessage           `json:"data"`
	Reason   string                    `json:"reason"`
	Error    string                    `json:"error"`
	Next     *time.Time                `json:"next_attempt_at"`
	TurnNo   int64                     `json:"turn_no"`
	Outcome  string                    `json:"outcome"`
	Messages []store.TranscriptMessage `json:"messages"`
	Oldest   int64                     `json:"oldest"`
	WaitID   string                    `json:"wait_id"`
	For      string                    `json:"for"`
	Kind     string                    `json:"kind"`
	Status   string                    `json:"status"`
}

// line prints one of the CLI's own lines, closing an open text line.
func (p *streamPrinter) line(format string, args ...any) {
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

// text prints answer text inline, every line of it indented.
func (p *streamPrinter) text(s string) {
	if !p.open {
		fmt.Fprint(p.w, contIndent)
		p.open = true
	}
	fmt.Fprint(p.w, safeText(s))
}

func (p *streamPrinter) print(ev apiclient.StreamEvent) error {
	if p.json {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "%s\n", b)
		return err
	}
	var d streamData
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		p.line("[%s %s: %s]", safeCell(ev.Event), ev.ID, oneLine(string(ev.Data), 200))
		return nil
	}
	key := [2]int64{d.EventID, d.Attempt}
	switch ev.Event {
	case apiclient.StreamTurnStarted:
		p.line("[event %d started, attempt %d]", d.EventID, d.Attempt)
	case apiclient.StreamChunk:
		switch d.Type {
		case "text":
			p.texts[key] = true
			p.text(d.Text)
		default:
			p.line("[%s %s]", safeCell(d.Type), oneLine(string(d.Data), 200))
		}
	case apiclient.StreamTurnRetrying, apiclient.StreamTurnFailed:
		if ev.Event == apiclient.StreamTurnRetrying && d.Reason == store.EndReasonApproval {
			discarded := ""
			if p.texts[key] {
				discarded = "; partial output above discarded"
			}
			delete(p.texts, key)
			p.line("[event %d paused for approval after attempt %d%s]", d.EventID, d.Attempt, discarded)
			break
		}
		what := "retrying"
		if ev.Event == apiclient.StreamTurnFailed {
			what = "failed"
		}
		msg := safeCell(d.Reason)
		if d.Error != "" {
			msg += ": " + oneLine(d.Error, 300)
		}
		if d.Next != nil {
			msg += fmt.Sprintf(" (next attempt at %s)", d.Next.Local().Format(time.TimeOnly))
		}
		p.line("[%s: %s]", what, msg)
		if p.texts[key] {
			delete(p.texts, key)
			p.line("[the partial answer of event %d attempt %d above was discarded]", d.EventID, d.Attempt)
		}
	case apiclient.StreamTurnCommitted:
		if !p.texts[key] {
			// Nothing was streamed: print the committed answer.
			for _, m := range d.Messages {
				if m.Role == "assistant" {
					p.text(m.Content)
				}
			}
		}
		delete(p.texts, key)
		outcome := ""
		if d.Outcome != "" && d.Outcome != "ok" {
			outcome = " (" + safeCell(d.Outcome) + ")"
		}
		p.line("[committed%s]", outcome)
	case apiclient.StreamWaitOpened:
		what := "waiting"
		if d.Kind == string(store.WaitKindApproval) {
			what = "waiting for approval"
		}
		p.line("[%s: wait %s: %s]", what, safeCell(d.WaitID), oneLine(d.For, 200))
		p.line("[resolve with: %s]", resolveHint(p.prog, p.agent, p.session, d.WaitID, store.WaitKind(d.Kind)))
	case apiclient.StreamWaitResolved:
		p.line("[wait %s %s]", safeCell(d.WaitID), safeCell(firstNonEmpty(d.Status, "resolved")))
	case apiclient.StreamReset:
		p.texts = map[[2]int64]bool{}
		p.line("[stream reset: the stream resumes at frame %d, events before it are not in the stream (compacted, or the position was not of this stream); reload the transcript (paddock transcript)]", d.Oldest)
	default:
		p.line("[%s %s]", safeCell(ev.Event), ev.ID)
	}
	return nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// done ends a printed stream: closes an open text line.
func (p *streamPrinter) done() {
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}

func newSessionStreamCmd(c *client) *cobra.Command {
	var after string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stream AGENT SESSION",
		Short: "Follow a session's stream: turns' output as it is produced, retries, commits, waits",
		Long: "Follow a session's stream (Server-Sent Events): text chunks print inline as they arrive, lifecycle\n" +
			"events as [..] lines. A dropped connection is resumed where it stopped (Last-Event-ID). --json prints\n" +
			"one JSON object per event: {\"id\", \"event\", \"data\"}.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := newStreamPrinter(cmd.OutOrStdout(), asJSON || c.output == "json", c.prog(), args[0], args[1])
			defer p.done()
			err := c.followStream(cmd.Context(), cmd.ErrOrStderr(), args[0], args[1], after, func(ev apiclient.StreamEvent) (bool, error) {
				return false, p.print(ev)
			})
			if ae := apiclient.AsError(err); ae != nil && (ae.Field == "Last-Event-ID" || ae.Field == "after") {
				return flagError(err, "--after %q: %s", after, ae.Message)
			}
			if errors.Is(err, context.Canceled) {
				return nil // interrupted: following a stream has no end of its own
			}
			return err
		},
	}
	cmd.Flags().StringVar(&after, "after", "", "start after this event id (<seq> or <seq>.<chunk>), or head: only what comes from now on; default: the oldest kept frame")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per event")
	return cmd
}

// TurnFailedError is the error of `signal send --stream` when the turn of
// the sent message failed for good.
type TurnFailedError struct {
	EventID int64
	Reason  string
	Err     string
}

func (e *TurnFailedError) Error() string {
	msg := fmt.Sprintf("the turn of event %d failed (%s)", e.EventID, e.Reason)
	if e.Err != "" {
		msg += ": " + oneLine(e.Err, 300)
	}
	return msg
}

// ExitWaitingForApproval is the exit status of `signal send --stream`
// when the sent message's turn is held for an approval.
const ExitWaitingForApproval = 3

// streamTurn follows the session's stream until the turn of event id
// commits (nil) or fails (*TurnFailedError), printing that event's
// events; events of other turns are skipped. A turn committed with
// outcome wait is followed up to its wait.opened (the wait's id and
// resolve command are printed); a turn held for an approval ends it with
// an *ExitError of status ExitWaitingForApproval. It gives up after
// timeout (0: never), saying what is still pending, and an interrupt
// (ctx cancelled) is an error too: the turn did not commit.
//
// es is the session's stream opened at "head" before the signal was sent,
// so that none of the turn's frames is missed and none of the session's
// history is read.
func (c *client) streamTurn(cmd *cobra.Command, agent, sess string, id int64, es *apiclient.EventStream, asJSON bool, timeout time.Duration) error {
	p := newStreamPrinter(cmd.OutOrStdout(), asJSON, c.prog(), agent, sess)
	defer p.done()
	ctx := cmd.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	pending := fmt.Sprintf("event %d is queued: no attempt of its turn started", id)
	committedWait := false
	err := c.followOpened(ctx, cmd.ErrOrStderr(), agent, sess, "head", es, func(ev apiclient.StreamEvent) (bool, error) {
		var d streamData
		if ev.Event == apiclient.StreamReset || json.Unmarshal(ev.Data, &d) != nil || d.EventID != id {
			return false, nil
		}
		if err := p.print(ev); err != nil {
			return true, err
		}
		switch ev.Event {
		case apiclient.StreamTurnStarted:
			pending = fmt.Sprintf("attempt %d of event %d's turn is running", d.Attempt, id)
		case apiclient.StreamTurnRetrying:
			pending = fmt.Sprintf("event %d's turn waits for its next attempt (%s)", id, safeCell(d.Reason))
		case apiclient.StreamTurnCommitted:
			if d.Outcome == string(abi.OutcomeWait) {
				committedWait = true
				pending = fmt.Sprintf("event %d's turn committed with outcome wait; its wait.opened frame", id)
				return false, nil
			}
			return true, nil
		case apiclient.StreamWaitOpened:
			if d.Kind == string(store.WaitKindApproval) {
				return true, &ExitError{Code: ExitWaitingForApproval, Err: fmt.Errorf("waiting for approval: event %d's turn is held until wait %s is resolved (exit status %d)", id, safeCell(d.WaitID), ExitWaitingForApproval)}
			}
			if committedWait {
				return true, nil
			}
		case apiclient.StreamTurnFailed:
			return true, &TurnFailedError{EventID: id, Reason: d.Reason, Err: d.Error}
		}
		return false, nil
	})
	switch {
	case err == nil, cmd.Context().Err() == nil && !errors.Is(err, context.DeadlineExceeded):
		return err
	case cmd.Context().Err() != nil:
		return fmt.Errorf("interrupted before the turn committed (event %d stays accepted; follow it with `%s session stream %s %s`)", id, c.prog(), shellArg(agent), shellArg(sess))
	}
	return fmt.Errorf("gave up after --wait-timeout %s: %s (event %d stays accepted; follow it with `%s session stream %s %s`)", timeout, pending, id, c.prog(), shellArg(agent), shellArg(sess))
}

// turnOf returns the event whose turn handles the sent event: a message
// handed to a turn in flight (mid_turn steer) commits with that turn.
func turnOf(ctx context.Context, api *apiclient.Client, agent, sess string, out apiclient.SignalResult) (int64, error) {
	if !out.InFlight {
		return out.EventID, nil
	}
	ev, err := api.GetEvent(ctx, agent, sess, out.EventID)
	if err != nil {
		return 0, err
	}
	if ev.SteerOf != 0 {
		return ev.SteerOf, nil
	}
	return out.EventID, nil
}

func newWaitCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "wait", Short: "List, show and resolve sessions' waits (for a human, or an approval)"}
	var status string
	list := &cobra.Command{
		Use: "list AGENT [SESSION]", Short: "List an agent's or a session's waits (--status open for an inbox)", Args: namedArgs("wait list", []string{"AGENT"}, []string{"SESSION"}),
		RunE: func(cmd *cobra.Command, args []string) error {
			api := c.api()
			o := apiclient.ListWaitsOptions{Status: store.WaitStatus(status), Limit: 1000}
			all := []apiclient.Wait{}
			for {
				var page apiclient.WaitList
				var err error
				if len(args) == 2 {
					page, err = api.SessionWaits(cmd.Context(), args[0], args[1], o)
				} else {
					page, err = api.AgentWaits(cmd.Context(), args[0], o)
				}
				if err != nil {
					return c.reach(err)
				}
				all = append(all, page.Waits...)
				if len(page.Waits) < o.Limit {
					break
				}
				o.After = page.NextAfter
			}
			return c.print(cmd, map[string]any{"waits": all}, func(w io.Writer) {
				if len(all) == 0 {
					fmt.Fprintln(w, "no waits")
					return
				}
				fmt.Fprintln(w, "SESSION\tWAIT\tKIND\tSTATUS\tCREATED\tFOR")
				for _, x := range all {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", safeCell(x.SessionID), safeCell(x.WaitID), x.Kind, x.Status,
						x.CreatedAt.Local().Format(time.DateTime), oneLine(x.For, 80))
				}
			})
		},
	}
	list.Flags().StringVar(&status, "status", "", "open, resolved, expired or cancelled")
	show := &cobra.Command{
		Use: "show AGENT SESSION WAIT", Short: "Show one wait", Args: namedArgs("wait show", []string{"AGENT", "SESSION", "WAIT"}, nil),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			w, err := c.api().GetWait(cmd.Context(), args[0], args[1], args[2], apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(tw io.Writer) { printWait(tw, c.prog(), args[0], w) })
		},
	}
	var data, reason string
	var approve, reject bool
	resolve := &cobra.Command{
		Use:   "resolve AGENT SESSION WAIT [--data JSON | --approve | --reject --reason TEXT]",
		Short: "Resolve an open wait: --data answers a wait, --approve or --reject decides an approval",
		Args:  namedArgs("wait resolve", []string{"AGENT", "SESSION", "WAIT"}, nil),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in apiclient.ResolveWaitRequest
			switch {
			case approve || reject:
				decision := approve
				in.Approved, in.Reason = &decision, reason
			case reason != "":
				return errors.New("--reason goes with --approve or --reject")
			case data != "":
				if err := checkDataFlag(data); err != nil {
					return err
				}
				in.Data = json.RawMessage(data)
			}
			var raw json.RawMessage
			w, err := c.api().ResolveWait(cmd.Context(), args[0], args[1], args[2], in, apiclient.Raw(&raw))
			if ae := apiclient.AsError(err); ae != nil && (ae.Code == apiclient.CodeInvalidField || ae.Code == apiclient.CodeMissingField) {
				switch {
				case ae.Field == "data" && (approve || reject || data != "") && strings.Contains(ae.Message, "is an approval"),
					ae.Field == "approved" && !approve && !reject:
					return flagError(err, "wait %s is an approval: use --approve or --reject [--reason TEXT]", safeCell(args[2]))
				case ae.Field == "approved" || ae.Field == "reason" && strings.Contains(ae.Message, "not an approval"):
					return flagError(err, "wait %s is not an approval: it takes --data JSON (e.g. --data '\"yes\"')", safeCell(args[2]))
				case ae.Field == "reason":
					return flagError(err, "--reason: %s", ae.Message)
				}
			}
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(tw io.Writer) {
				fmt.Fprintf(tw, "wait %s resolved; the session wakes\n", safeCell(w.WaitID))
			})
		},
	}
	resolve.Flags().StringVar(&data, "data", "", "the answer of a wait, any JSON value (default null)")
	resolve.Flags().BoolVar(&approve, "approve", false, "approve an approval wait: its host call runs")
	resolve.Flags().BoolVar(&reject, "reject", false, "reject an approval wait: its host call is refused")
	resolve.Flags().StringVar(&reason, "reason", "", "with --approve or --reject: told to the agent")
	resolve.MarkFlagsMutuallyExclusive("data", "approve", "reject")
	cmd.AddCommand(list, show, resolve)
	return cmd
}

// hintError is an API error said in the CLI's words (its flags): Error
// is the sentence, Unwrap the API error (apiclient.IsCode still works).
type hintError struct {
	msg string
	err error
}

func (e *hintError) Error() string { return e.msg }
func (e *hintError) Unwrap() error { return e.err }

// flagError wraps err, an API error, in an *ExitError printing the
// sentence format names.
func flagError(err error, format string, args ...any) error {
	return &ExitError{Code: 1, Err: &hintError{msg: fmt.Sprintf(format, args...), err: err}}
}

// checkDataFlag checks a --data flag's value is JSON; a bare word gets a
// hint to quote it as a JSON string.
func checkDataFlag(data string) error {
	if json.Valid([]byte(data)) {
		return nil
	}
	if q, err := json.Marshal(data); err == nil {
		return fmt.Errorf("--data is not valid JSON: a string is quoted, e.g. --data '%s'", strings.ReplaceAll(string(q), "'", `'\''`))
	}
	return errors.New("--data is not valid JSON")
}

// namedArgs checks a command's arguments against its usage: required
// then optional names; a missing or extra argument is an error naming it
// ("wait list AGENT [SESSION]: missing AGENT").
func namedArgs(name string, required, optional []string) cobra.PositionalArgs {
	usage := name + " " + strings.Join(required, " ")
	for _, o := range optional {
		usage += " [" + o + "]"
	}
	return func(_ *cobra.Command, args []string) error {
		switch {
		case len(args) < len(required):
			return fmt.Errorf("%s: missing %s", usage, strings.Join(required[len(args):], " "))
		case len(args) > len(required)+len(optional):
			return fmt.Errorf("%s: unexpected argument %q", usage, args[len(required)+len(optional)])
		}
		return nil
	}
}

// printWait prints one wait for `wait show`; prog starts the resolve
// command it suggests (client.prog).
func printWait(w io.Writer, prog, agent string, x apiclient.Wait) {
	fmt.Fprintf(w, "wait\t%s\nsession\t%s\nkind\t%s\nstatus\t%s\nevent\t%d\n", safeCell(x.WaitID), safeCell(x.SessionID), x.Kind, x.Status, x.EventID)
	if x.For != "" {
		fmt.Fprintf(w, "for\t%s\n", safeCell(x.For))
	}
	if len(x.Data) > 0 {
		fmt.Fprintf(w, "data\t%s\n", safeCell(string(x.Data)))
	}
	if x.CallSeq != 0 {
		fmt.Fprintf(w, "host call\t%d (%s)\n", x.CallSeq, safeCell(x.CallDigest))
	}
	fmt.Fprintf(w, "created\t%s\n", x.CreatedAt.Local().Format(time.DateTime))
	if x.ExpiresAt != nil {
		fmt.Fprintf(w, "expires\t%s\n", x.ExpiresAt.Local().Format(time.DateTime))
	}
	if x.ClosedAt != nil {
		fmt.Fprintf(w, "closed\t%s\n", x.ClosedAt.Local().Format(time.DateTime))
	}
	if len(x.Resolution) > 0 {
		fmt.Fprintf(w, "resolution\t%s\n", safeCell(string(x.Resolution)))
	}
	if x.Status == store.WaitOpen {
		fmt.Fprintf(w, "resolve with\t%s\n", resolveHint(prog, agent, x.SessionID, x.WaitID, x.Kind))
	}
}
