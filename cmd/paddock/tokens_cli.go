package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// newTokenCmd is `paddock token create|list|revoke` (admins).
func newTokenCmd(c *client) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke API tokens (admins)"}
	var in apiclient.CreateTokenRequest
	create := &cobra.Command{
		Use:   "create --role reader|client|operator|admin [--name TEXT]",
		Short: "Create a token and print its value, which is shown this once",
		Long: "Create a token and print its value, which is shown this once (the host keeps only a hash).\n" +
			"reader reads; client also creates sessions and sends messages; operator also steers, cancels,\n" +
			"wakes, destroys, redrives, discards and resolves waits; admin also registers modules, plugins,\n" +
			"agents and secrets, manages tokens and reads the audit log.\n" +
			"The token belongs to the namespace the command acts in: the global --namespace/-n\n" +
			"(env PADDOCK_NAMESPACE), else the caller's token's own namespace, else default.\n\n" +
			"  paddock -n team-a token create --role client --name \"checkout service\"",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var raw json.RawMessage
			t, err := c.api().CreateToken(cmd.Context(), in, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintf(w, "token %s (%s of namespace %s) created; its value, shown this once:\n%s\n",
					t.ID, safeCell(t.Role), safeCell(t.Namespace), t.Value)
			})
		},
	}
	create.Flags().StringVar(&in.Role, "role", "", "reader, client, operator or admin (required)")
	create.Flags().StringVar(&in.Name, "name", "", "a description of the token")
	_ = create.MarkFlagRequired("role")
	list := &cobra.Command{
		Use: "list", Short: "List tokens (never their values)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var raw json.RawMessage
			ts, err := c.api().ListTokens(cmd.Context(), apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tNAMESPACE\tROLE\tNAME\tCREATED\tBY\tREVOKED")
				for _, t := range ts {
					revoked := "-"
					if t.RevokedAt != nil {
						revoked = t.RevokedAt.Local().Format(time.DateTime)
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, safeCell(t.Namespace), safeCell(t.Role), safeCell(t.Name),
						t.CreatedAt.Local().Format(time.DateTime), safeCell(t.CreatedBy), revoked)
				}
			})
		},
	}
	revoke := &cobra.Command{
		Use: "revoke ID|VALUE", Short: "Revoke a token: it stops working at once, on every host", Args: cobra.ExactArgs(1),
		Long: "Revoke a token: it stops working at once, on every host. Name it by its id (`token list`)\n" +
			"or by its full value pdk_<id>_<secret>: the id is taken from the value here, and the secret\n" +
			"is never sent.",
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := tokenID(args[0])
			if err != nil {
				return err
			}
			var raw json.RawMessage
			t, err := c.api().RevokeToken(cmd.Context(), id, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintf(w, "token %s revoked\n", t.ID)
			})
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

// tokenID returns the token id arg names: arg itself, or the id part of
// a full token value "pdk_<id>_<secret>" (service.TokenPrefix), so that
// the secret is never sent. A value of another shape is an error that
// does not repeat it.
func tokenID(arg string) (string, error) {
	rest, ok := strings.CutPrefix(arg, service.TokenPrefix)
	if !ok {
		return arg, nil
	}
	if len(rest) <= store.TokenIDLen || rest[store.TokenIDLen] != '_' || store.CheckTokenID(rest[:store.TokenIDLen]) != nil {
		return "", fmt.Errorf("token revoke: the argument starts with %q but is not a token value pdk_<id>_<secret>: give the token's id (paddock token list)", service.TokenPrefix)
	}
	return rest[:store.TokenIDLen], nil
}

// newAuditCmd is `paddock audit` (admins): a page of the audit log.
func newAuditCmd(c *client) *cobra.Command {
	var before int64
	var limit int
	cmd := &cobra.Command{
		Use:   "audit [--limit N] [--before ID]",
		Short: "Show the audit log, newest first: who (token id) did what to which object, when, and how it ended (admins)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var raw json.RawMessage
			page, err := c.api().ListAudit(cmd.Context(), before, limit, apiclient.Raw(&raw))
			if err != nil {
				return c.reach(err)
			}
			return c.print(cmd, raw, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tAT\tTOKEN\tNAMESPACE\tACTION\tOBJECT\tRESULT")
				for _, e := range page.Entries {
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.At.Local().Format(time.DateTime), safeCell(e.TokenID),
						safeCell(e.Namespace), safeCell(e.Action), safeCell(e.Object), safeCell(e.Result))
				}
				if page.NextBefore != 0 {
					fmt.Fprintf(w, "(more: --before %d)\n", page.NextBefore)
				}
			})
		},
	}
	cmd.Flags().Int64Var(&before, "before", 0, "show rows older than this id (the previous page's last)")
	cmd.Flags().IntVar(&limit, "limit", 0, "rows per page (default 100, at most 1000)")
	return cmd
}
