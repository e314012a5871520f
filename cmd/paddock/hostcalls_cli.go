package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// The client commands of host calls: secrets, an agent's capabilities and
// an event's journal (README "Host calls").

// httpRuleCell renders an http rule: "GET,POST https://api.example.com
// (secrets API_KEY)".
func httpRuleCell(r apiclient.HTTPRule) string {
	methods := "GET,HEAD"
	if len(r.Methods) > 0 {
		methods = strings.Join(r.Methods, ",")
	}
	dest := r.Scheme + "://" + r.Host
	if r.Port != 0 {
		dest += ":" + strconv.Itoa(r.Port)
	}
	out := methods + " " + dest
	if r.AllowPrivate {
		out += " (private addresses allowed)"
	}
	if len(r.Secrets) > 0 {
		out += " (secrets " + strings.Join(r.Secrets, ", ") + ")"
	}
	return safeCell(out)
}

// listCell joins names for a cell, or says none.
func listCell(names []string, none string) string {
	if len(names) == 0 {
		return none
	}
	return safeCell(strings.Join(names, ", "))
}

// limitCell renders a limit: 0 is none of the agent's own.
func limitCell(n int64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

// printCalls prints an event's journal as a table: one row per host call
// by seq, set-aside rows included. Destinations and error codes come from
// the agent's requests and upstream answers: they are escaped.
func printCalls(w io.Writer, calls []apiclient.HostCall) {
	if len(calls) == 0 {
		return
	}
	fmt.Fprintf(w, "host calls (%d):\n", len(calls))
	fmt.Fprintln(w, "SEQ\tKIND\tDESTINATION\tRESULT\tDURATION\tTOKENS\tEPOCH\tREPLAYED\tSET ASIDE")
	for _, c := range calls {
		result := "ok"
		switch {
		case c.ErrorCode != "" && c.Status != 0:
			result = fmt.Sprintf("%s (HTTP %d)", c.ErrorCode, c.Status)
		case c.ErrorCode != "" && c.ErrorReason != "":
			result = c.ErrorCode + " (" + c.ErrorReason + ")"
		case c.ErrorCode != "":
			result = c.ErrorCode
		case c.Status != 0:
			result = strconv.Itoa(c.Status)
		}
		tokens := "-"
		if c.InputTokens != 0 || c.OutputTokens != 0 {
			tokens = fmt.Sprintf("%d in / %d out", c.InputTokens, c.OutputTokens)
		}
		replayed := "live"
		if c.Replays > 0 {
			replayed = fmt.Sprintf("replayed ×%d (last epoch %d)", c.Replays, c.ReplayedEpoch)
		}
		aside := ""
		if c.SetAside {
			aside = "set aside"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", c.Seq, safeCell(c.Kind), oneLine(c.Destination, 80), oneLine(result, 60),
			(time.Duration(c.DurationMS) * time.Millisecond).String(), tokens, c.ActorEpoch, replayed, aside)
	}
	for _, c := range calls {
		if c.ErrorMessage != "" {
			fmt.Fprintf(w, "  seq %d (epoch %d): %s\n", c.Seq, c.ActorEpoch, oneLine(c.ErrorMessage, 200))
		}
	}
}

// secretValue reads the value of `secret set`: from --from-file, from the
// environment variable --from-env, or from stdin; never from the command
// line, where ps and shell histories show it. One trailing newline (as
// `echo` or an editor leaves) is dropped from stdin and files.
func secretValue(cmd *cobra.Command, fromFile, fromEnv string) (string, error) {
	var raw []byte
	switch {
	case fromFile != "":
		b, err := os.ReadFile(fromFile)
		if err != nil {
			// The error names the file, not its content.
			return "", fmt.Errorf("--from-file: %w", err)
		}
		raw = b
	case fromEnv != "":
		v, ok := os.LookupEnv(fromEnv)
		if !ok {
			return "", fmt.Errorf("--from-env %s: the variable is not set", fromEnv)
		}
		return v, nil
	default:
		in := cmd.InOrStdin()
		if f, ok := in.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "paddock: reading the secret's value from stdin (end with Ctrl-D; it is echoed: prefer a pipe, --from-file or --from-env)")
			}
		}
		b, err := io.ReadAll(io.LimitReader(in, service.MaxSecretBytes+3))
		if err != nil {
			return "", fmt.Errorf("reading the value from stdin: %w", err)
		}
		raw = b
	}
	raw = bytes.TrimSuffix(raw, []byte("\n"))
	raw = bytes.TrimSuffix(raw, []byte("\r"))
	if len(raw) == 0 {
		return "", errors.New("the secret's value is empty")
	}
	return string(raw), nil
}

func newSecretCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "secret", Short: "Set, list and delete secrets agents' http calls may use ({{secret:NAME}})"}
	var fromFile, fromEnv string
	set := &cobra.Command{
		Use:   "set NAME [--from-file PATH | --from-env VAR]",
		Short: "Set a secret from stdin (or a file or an environment variable); the host seals it and never shows it again",
		Long: "Set a secret from stdin (or a file or an environment variable); the host seals it and never shows it again.\n" +
			"The value is never taken as an argument: arguments are visible to every user in ps.\n\n" +
			"  printf %s \"$TOKEN\" | paddock secret set API_KEY\n  paddock secret set API_KEY --from-file token.txt\n  paddock secret set API_KEY --from-env TOKEN",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// The name first: a bad one should not cost typing the value.
			if err := store.CheckSecretName(args[0]); err != nil {
				return fmt.Errorf("secret name %q: 1 to %d characters of A-Z, a-z, 0-9, '_', '.', '-'", args[0], store.MaxSecretNameLen)
			}
			value, err := secretValue(cmd, fromFile, fromEnv)
			if err != nil {
				return err
			}
			var raw json.RawMessage
			sec, created, err := c.api().PutSecret(cmd.Context(), args[0], value, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				if created {
					fmt.Fprintf(w, "secret %s set\n", safeCell(sec.Name))
				} else {
					fmt.Fprintf(w, "secret %s replaced\n", safeCell(sec.Name))
				}
			})
		},
	}
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file (one trailing newline is dropped)")
	set.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this environment variable")
	set.MarkFlagsMutuallyExclusive("from-file", "from-env")
	list := &cobra.Command{
		Use: "list", Short: "List the secrets set through the API (names only)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var raw json.RawMessage
			secs, err := c.api().ListSecrets(cmd.Context(), apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tCREATED\tUPDATED")
				for _, s := range secs {
					fmt.Fprintf(w, "%s\t%s\t%s\n", safeCell(s.Name), s.CreatedAt.Local().Format(time.DateTime), s.UpdatedAt.Local().Format(time.DateTime))
				}
			})
		},
	}
	del := &cobra.Command{
		Use: "delete NAME", Short: "Delete a secret set through the API", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.api().DeleteSecret(cmd.Context(), args[0]); err != nil {
				return c.reach(err)
			}
			return c.print(cmd, map[string]any{"name": args[0], "deleted": true}, func(w io.Writer) {
				fmt.Fprintf(w, "secret %s deleted\n", safeCell(args[0]))
			})
		},
	}
	cmd.AddCommand(set, list, del)
	return cmd
}
