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
// error), when ctx ends (nil), or with an API error (unknown session, a
// destroyed one).
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
				return nil
			}
			if apiclient.AsError(err) != nil && !apiclient.IsServerError(err) {
				return err
			}
			fmt.Fprintf(stderr, "paddock: %v; reconnecting\n", c.reach(err))
			if !sleepCtx(ctx, reconnectDelay) {
				return nil
			}
			continue
		}
		for {
			ev, err := es.Next()
			if id := es.LastEventID(); id != "" {
				last = id // also where a stream opened at "head" started
			}
			if err != nil {
				es.Close()
				if ctx.Err() != nil {
					return nil
				}
				delay := es.Retry()
				if delay <= 0 {
					delay = reconnectDelay
				}
				at := last
				if at == "" {
					at = "the start"
				}
				fmt.Fprintf(stderr, "paddock: stream dropped (%v); reconnecting after %s\n", err, at)
				es = nil
				if !sleepCtx(ctx, delay) {
					return nil
				}
				break
			}
			if done, err := handle(ev); done || err != nil {
				es.Close()
				return err
			}
		}
	}
}

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
}

func newStreamPrinter(w io.Writer, asJSON bool) *streamPrinter {
	return &streamPrinter{w: w, json: asJSON, texts: map[[2]int64]bool{}}
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
		p.line("[turn %d started attempt %d]", d.EventID, d.Attempt)
	case apiclient.StreamChunk:
		switch d.Type {
		case "text":
			p.texts[key] = true
			p.text(d.Text)
		default:
			p.line("[%s %s]", safeCell(d.Type), oneLine(string(d.Data), 200))
		}
	case apiclient.StreamTurnRetrying, apiclient.StreamTurnFailed:
		what := "retrying"
		if ev.Event == apiclient.StreamTurnFailed {
			what = "failed"
		}
		msg := safeCell(d.Reason)
		if d.Error != "" {
			msg += ": " + oneLine(d.Error, 300)
		}
		if d.Next != nil && d.Reason != store.EndReasonApproval {
			msg += fmt.Sprintf(" (next attempt at %s)", d.Next.Local().Format(time.TimeOnly))
		}
		p.line("[%s: %s]", what, msg)
		if p.texts[key] {
			delete(p.texts, key)
			p.line("[the partial answer of turn %d attempt %d above was discarded]", d.EventID, d.Attempt)
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
		p.line("[%s: wait %s %s (paddock wait resolve)]", what, safeCell(d.WaitID), oneLine(d.For, 200))
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
			p := newStreamPrinter(cmd.OutOrStdout(), asJSON || c.output == "json")
			defer p.done()
			return c.followStream(cmd.Context(), cmd.ErrOrStderr(), args[0], args[1], after, func(ev apiclient.StreamEvent) (bool, error) {
				return false, p.print(ev)
			})
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

// streamTurn follows the session's stream until the turn of event id
// commits (nil) or fails (*TurnFailedError), printing that event's
// events; events of other turns are skipped.
//
// es is the session's stream opened at "head" before the signal was sent,
// so that none of the turn's frames is missed and none of the session's
// history is read.
func (c *client) streamTurn(cmd *cobra.Command, agent, sess string, id int64, es *apiclient.EventStream, asJSON bool) error {
	p := newStreamPrinter(cmd.OutOrStdout(), asJSON)
	defer p.done()
	return c.followOpened(cmd.Context(), cmd.ErrOrStderr(), agent, sess, "head", es, func(ev apiclient.StreamEvent) (bool, error) {
		var d streamData
		if ev.Event == apiclient.StreamReset || json.Unmarshal(ev.Data, &d) != nil || d.EventID != id {
			return false, nil
		}
		if err := p.print(ev); err != nil {
			return true, err
		}
		switch ev.Event {
		case apiclient.StreamTurnCommitted:
			return true, nil
		case apiclient.StreamTurnFailed:
			return true, &TurnFailedError{EventID: id, Reason: d.Reason, Err: d.Error}
		}
		return false, nil
	})
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
		Use: "list AGENT [SESSION]", Short: "List an agent's or a session's waits (--status open for an inbox)", Args: cobra.RangeArgs(1, 2),
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
		Use: "show AGENT SESSION WAIT", Short: "Show one wait", Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			w, err := c.api().GetWait(cmd.Context(), args[0], args[1], args[2], apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(tw io.Writer) { printWait(tw, w) })
		},
	}
	var data, reason string
	var approve, reject bool
	resolve := &cobra.Command{
		Use:   "resolve AGENT SESSION WAIT [--data JSON | --approve | --reject --reason TEXT]",
		Short: "Resolve an open wait: --data answers a wait, --approve or --reject decides an approval",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in apiclient.ResolveWaitRequest
			switch {
			case approve || reject:
				decision := approve
				in.Approved, in.Reason = &decision, reason
			case reason != "":
				return errors.New("--reason goes with --approve or --reject")
			case data != "":
				if !json.Valid([]byte(data)) {
					return fmt.Errorf("--data is not valid JSON")
				}
				in.Data = json.RawMessage(data)
			}
			var raw json.RawMessage
			w, err := c.api().ResolveWait(cmd.Context(), args[0], args[1], args[2], in, apiclient.Raw(&raw))
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

// printWait prints one wait for `wait show`.
func printWait(w io.Writer, x apiclient.Wait) {
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
		hint := "paddock wait resolve … --data JSON"
		if x.Kind == store.WaitKindApproval {
			hint = "paddock wait resolve … --approve | --reject --reason TEXT"
		}
		fmt.Fprintf(w, "resolve with\t%s\n", strings.TrimSpace(hint))
	}
}
