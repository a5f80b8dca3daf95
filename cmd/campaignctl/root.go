package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/iys"
)

// app is what every command shares: streams, environment and global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	logLevel       string
	databaseURL    string
	redisURL       string
	audienceURL    string
	// engineConns is the size of the engine database's pool when DATABASE_URL does not set
	// pool_max_conns (0: pgx's default, the machine's cores and at least 4).
	engineConns int32
}

// usageError marks bad usage or bad input (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run builds a fresh command tree, runs it and maps the result to an exit code: 0 success, 1 failure,
// 2 bad usage or bad input.
func run(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	root := a.newRootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "Error:", err)
	if isUsage(err) {
		return 2
	}
	return 1
}

func isUsage(err error) bool {
	var ue usageError
	var le *iys.LineError
	var cle *codes.LineError
	switch {
	case errors.As(err, &ue), errors.As(err, &le), errors.As(err, &cle), errors.Is(err, codes.ErrInvalidOptions),
		errors.Is(err, campaign.ErrInvalid), errors.Is(err, campaign.ErrNameTaken),
		errors.Is(err, campaign.ErrPoolShort), errors.Is(err, campaign.ErrNotFound), errors.Is(err, campaign.ErrWrongState), errors.Is(err, campaign.ErrConsentStale),
		errors.Is(err, codes.ErrPoolNotFound), errors.Is(err, campaign.ErrSchema):
		return true
	}
	// cobra's own flag and argument errors
	msg := err.Error()
	for _, p := range []string{"unknown flag", "unknown shorthand flag", "unknown command", "invalid argument", "accepts ", "requires at least", "flag needs an argument", "required flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func (a *app) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "campaignctl",
		Short:         "Send a unique promo code to millions by SMS, e-mail or push, without double sends and only with consent",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.logLevel {
			case "debug", "info", "warn", "error":
				return nil
			}
			return usagef("--log-level %q: use debug, info, warn or error", a.logLevel)
		},
	}
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().StringVar(&a.databaseURL, "database-url", "", "engine database (default $DATABASE_URL or "+defaultDatabaseURL+")")
	root.PersistentFlags().StringVar(&a.redisURL, "redis-url", "", "Redis for queues, claims and buckets (default $REDIS_URL or "+defaultRedisURL+")")
	root.PersistentFlags().StringVar(&a.audienceURL, "audience-database-url", "", "database the audience SQL runs on (default $AUDIENCE_DATABASE_URL or the engine database)")

	root.AddCommand(
		a.newMigrateCmd(),
		a.newDemoCmd(),
		a.newIYSCmd(),
		a.newCodesCmd(),
		a.newLaunchCmd(),
		a.newWorkerCmd(),
		a.newStatusCmd(),
		a.newReportCmd(),
		a.newResumeCmd(),
		a.newCancelCmd(),
		a.newWebhooksCmd(),
		a.newPauseCmd(),
		a.newDLQCmd(),
		a.newSandboxCmd(),
		a.newUICmd(),
		a.newWorkersCmd(),
		a.newVersionCmd(),
	)
	// cobra adds `completion` only when the root runs; added now, it refuses an unknown shell as the
	// other groups refuse an unknown command (it printed its help and succeeded). Its scripts go where the
	// root's output is at this moment.
	root.SetOut(a.stdout)
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		refuseUnknownSubcommands(c)
	}
	root.SetFlagErrorFunc(flagValueError)
	return root
}

// flagValueError says, for a flag value its standard parser refused (pflag.InvalidValueError over a
// strconv or time.ParseDuration error), what kind the flag takes, instead of the parser's words
// (strconv.ParseFloat: parsing "abc": invalid syntax). A flag of the project's own type says what it takes
// itself, and is left as it is.
func flagValueError(cmd *cobra.Command, err error) error {
	var bad *pflag.InvalidValueError
	if !errors.As(err, &bad) {
		// An unknown flag, a flag without its value: pflag's words, and where the flags are listed.
		return usagef("%v; see `%s --help`", err, cmd.CommandPath())
	}
	f := bad.GetFlag()
	var num *strconv.NumError
	parsed := errors.As(err, &num)
	var want string
	switch typ := f.Value.Type(); {
	case parsed && strings.HasPrefix(typ, "float"):
		want = "a number, e.g. 50 or 0.5"
	case parsed && (strings.HasPrefix(typ, "int") || strings.HasPrefix(typ, "uint")):
		want = "a whole number, e.g. 16"
		if d := f.DefValue; d != "" && d != "0" {
			want = "a whole number, e.g. " + d + " (the default)"
		}
	case parsed && typ == "bool":
		want = "true or false"
	case typ == "duration" && strings.HasPrefix(errors.Unwrap(err).Error(), "time: "):
		want = "a duration, e.g. 30s, 5m or 2h"
	default:
		return err
	}
	return usagef("--%s %q is not %s; see `%s --help`", f.Name, bad.GetValue(), want, cmd.CommandPath())
}

// refuseUnknownSubcommands makes a command group (iys, codes, dlq, demo) refuse a word that is none of
// its commands, as the root does (exit 2), instead of printing its help and succeeding: a cron job with a
// typo must fail. The group alone still prints its help.
func refuseUnknownSubcommands(c *cobra.Command) {
	if !c.HasSubCommands() {
		return
	}
	for _, sub := range c.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if c.Runnable() {
		return
	}
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		var names []string
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() {
				names = append(names, sub.Name())
			}
		}
		hint := ""
		cmd.SuggestionsMinimumDistance = 2
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			hint = fmt.Sprintf("did you mean %q? ", s[0])
		}
		return usagef("unknown command %q for %q: %sits commands are %s (see `%s --help`)", args[0], cmd.CommandPath(), hint, strings.Join(names, ", "), cmd.CommandPath())
	}
}

// logger writes structured logs to stderr: text on a terminal, JSON otherwise.
func (a *app) logger() *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(a.logLevel)) //nolint:errcheck // validated in PersistentPreRunE
	opts := &slog.HandlerOptions{Level: lvl}
	if isTerminal(a.stderr) {
		return slog.New(slog.NewTextHandler(a.stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(a.stderr, opts))
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// drawsBars says whether w is a terminal that bars can be drawn on: one that says how wide it is, and, for
// the live bars of several lines (rows), how tall. A pseudo-terminal of no size (some CI runners, `ssh -t`
// or script(1) from a script, `stty cols` alone) showed nothing at all for a whole `status --watch`; there
// the lines written for a pipe go instead.
func drawsBars(w any, rows bool) bool {
	if !isTerminal(w) {
		return false
	}
	width, height, err := term.GetSize(int(w.(*os.File).Fd()))
	return err == nil && width > 0 && (height > 0 || !rows)
}

// exactlyOne refuses anything but one argument, naming what the command needs and how to give it.
func exactlyOne(what, hint string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) == 0:
			return usagef("%s needs %s: %s", cmd.CommandPath(), what, hint)
		case len(args) > 1:
			return usagef("%s takes one argument (%s), not %d (%s): %s", cmd.CommandPath(), what, len(args), strings.Join(args, " "), hint)
		}
		return nil
	}
}

// campaignIDHint is how to give a campaign's ID.
func campaignIDHint(cmd string) string {
	return "e.g. `campaignctl " + cmd + " 42`; `campaignctl status` lists the campaigns and their IDs"
}
