// Command paddock is the Paddock host (`paddock serve`) and its client.
//
//	paddock serve [--config paddock.yaml]
//	paddock module upload agent.wasm
//	paddock agent create notes --module sha256:…
//	paddock session create notes
//	paddock signal send notes <session> "hello"
//	paddock transcript notes <session> --follow
//	paddock session stream notes <session>
//	paddock wait list notes --status open
//	paddock -n team-a token create --role client
//	paddock audit --limit 20
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/abi"
	apiclient "github.com/paddock-dev/paddock/host/api/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		var ae *apiclient.Error
		var ee *ExitError
		if errors.As(err, &ee) {
			fmt.Fprintf(os.Stderr, "paddock: %v\n", ee.Err)
			os.Exit(ee.Code)
		}
		if errors.As(err, &ae) {
			fmt.Fprintf(os.Stderr, "paddock: %s\n", apiErrorMessage(ae))
		} else {
			fmt.Fprintf(os.Stderr, "paddock: %v\n", err)
		}
		os.Exit(1)
	}
}

// apiErrorMessage is the CLI's sentence for an API error: the error, and
// for a 401 a hint naming --token and PADDOCK_TOKEN, for an answer with
// Retry-After (a 429 quota refusal) the seconds to wait.
func apiErrorMessage(ae *apiclient.Error) string {
	msg := ae.Error()
	if ae.Status == http.StatusUnauthorized {
		msg += " (give a token with --token or the environment variable PADDOCK_TOKEN)"
	}
	if ae.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %d s)", int64(ae.RetryAfter/time.Second))
	}
	return msg
}

// ExitError ends the CLI with exit status Code, printing Err.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "paddock",
		Short:         "Paddock hosts long-lived AI-agent sessions",
		Long:          "Paddock hosts long-lived AI-agent sessions: a signal wakes a session, one turn of its agent runs\nin a wasm sandbox, and the turn commits durably behind epoch/lease fences.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.Version = version()
	cl := &client{}
	pf := root.PersistentFlags()
	pf.StringVar(&cl.server, "server", envOr("PADDOCK_SERVER", "http://127.0.0.1:8080"), "API address (env PADDOCK_SERVER)")
	// The token's default is read when a command calls the API, not shown
	// as the flag's default: --help must not print it.
	pf.StringVar(&cl.token, "token", "", "bearer token (default: env PADDOCK_TOKEN)")
	pf.StringVarP(&cl.output, "output", "o", "text", "output format of client commands: text or json")
	pf.StringVarP(&cl.namespace, "namespace", "n", os.Getenv("PADDOCK_NAMESPACE"),
		"namespace the client commands act in (env PADDOCK_NAMESPACE; default: the token's own namespace, else default)")
	root.AddCommand(newServe(), newWorkerCmd(), newBenchCmd(), newModuleCmd(cl), newPluginCmd(cl), newAgentCmd(cl), newSessionCmd(cl), newSignalCmd(cl),
		newTranscriptCmd(cl), newEventsCmd(cl), newEventCmd(cl), newDeadLettersCmd(cl), newSecretCmd(cl), newWaitCmd(cl),
		newTokenCmd(cl), newAuditCmd(cl))
	withUsageOnArgErrors(root)
	return root
}

// withUsageOnArgErrors makes every command under c name its usage line
// when its arguments are wrong: cobra's "accepts 3 arg(s), received 2"
// alone does not say which one is missing (SilenceUsage keeps the full
// help out of every other error).
func withUsageOnArgErrors(c *cobra.Command) {
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			err := args(cmd, a)
			if err != nil && !strings.Contains(err.Error(), cmd.Use) { // a command's own check may name it already
				return fmt.Errorf("%w; usage: %s", err, cmd.UseLine())
			}
			return err
		}
	}
	for _, sub := range c.Commands() {
		withUsageOnArgErrors(sub)
	}
}

// version reports the module version and, for a build from a checkout, the
// commit it was built from.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " (" + s.Value[:12] + ")"
		}
	}
	return v + ", abi v" + strconv.Itoa(abi.Version) + ", " + bi.GoVersion
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
