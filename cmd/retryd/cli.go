package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/retryd/retryd/server"
)

// command is one subcommand of retryd.
type command struct {
	name string
	// synopsis is what follows the name in the usage line.
	synopsis string
	// summary is one line saying what the command does.
	summary string
	run     func(ctx context.Context, e *env, args []string) error
}

// env is what a command reads and writes besides its arguments.
type env struct {
	getenv         func(string) string
	stdin          io.Reader
	stdout, stderr io.Writer
}

// commands lists the subcommands in the order help shows them.
func commands() []command {
	return []command{
		{"serve", "[flags]", "serve the RetryService (the default command)", serve},
		{"check-config", "--config FILE", "validate a policy file and print each policy's key", checkConfig},
		{"check-credentials", "--auth-credentials FILE", "validate a credentials file and describe its tenants", checkCredentials},
		{"hash-token", "< TOKEN", "print the hex SHA-256 of the bearer token on stdin, for tokens[].sha256 of the credentials file", hashToken},
		{"verify", "(--file FILE | --server ADDR) [flags]", "run the invariant checker over an event log", verify},
		{"version", "", "print the version", version},
		{"help", "[command]", "show the commands, or one command's flags", help},
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// errHelpShown ends a run that printed the help asked for: exit status 0.
var errHelpShown = errors.New("help shown")

// usageError is a command line retryd cannot run: an unknown command or
// flag, a bad value or a missing one. It exits with status 2 and one line
// naming the problem, with a hint to the command's --help.
type usageError struct {
	cmd string // the command, or "" for the top level
	err error
}

func (e *usageError) Error() string {
	hint := "retryd --help"
	if e.cmd != "" {
		hint = "retryd " + e.cmd + " --help"
	}
	return fmt.Sprintf("%v (see '%s')", e.err, hint)
}

func (e *usageError) Unwrap() error { return e.err }

// usage wraps err as a usage error of cmd.
func usage(cmd string, err error) error {
	if err == nil {
		return nil
	}
	return &usageError{cmd: cmd, err: fmt.Errorf("%s: %w", cmd, err)}
}

// run runs the command args name (serve without one) and returns what
// ended it; exitCode turns that into the process's exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	e := &env{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			return help(ctx, e, args[1:])
		case "-version", "--version":
			return version(ctx, e, args[1:])
		}
	}
	name := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	c, ok := lookup(name)
	if !ok {
		return &usageError{err: fmt.Errorf("unknown command %q", name)}
	}
	return c.run(ctx, e, args)
}

// exitCode prints what ended a run to stderr, if anything, and returns
// the exit status: 0 for success or help, 2 for a usage error, else 1.
func exitCode(stderr io.Writer, err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, errHelpShown):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "retryd:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "retryd:", err)
		return 1
	}
}

// newFlags returns the flag set of the command name. Parse it with
// e.parse, which prints help and reports errors the same way for every
// command.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors in one line; help goes to stdout
	fs.Usage = func() {}
	return fs
}

// parse parses args into fs. -h or --help prints the command's help to
// stdout and returns errHelpShown; a bad or unknown flag returns a usage
// error naming it; so do arguments left over, unless the command takes
// them (positional).
func (e *env) parse(fs *flag.FlagSet, args []string, positional bool) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		e.commandHelp(fs)
		return errHelpShown
	case err != nil:
		return usage(fs.Name(), err)
	case !positional && fs.NArg() > 0:
		return usage(fs.Name(), fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	return nil
}

// commandHelp prints the usage line, summary and flags of fs's command.
func (e *env) commandHelp(fs *flag.FlagSet) {
	c, _ := lookup(fs.Name())
	fmt.Fprintf(e.stdout, "usage: retryd %s %s\n\n%s.\n", c.name, c.synopsis, capitalize(c.summary))
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(e.stdout, "\nflags:")
		fs.SetOutput(e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// help prints the list of commands, or with a command name that command's
// help.
func help(_ context.Context, e *env, args []string) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		c, ok := lookup(args[0])
		if !ok {
			return &usageError{err: fmt.Errorf("help: unknown command %q", args[0])}
		}
		return c.run(context.Background(), e, []string{"--help"})
	}
	fmt.Fprint(e.stdout, "retryd is the retry-decision service for LLM agent fleets.\n\n"+
		"usage: retryd [command] [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(e.stdout, "  %-18s %s\n", c.name, c.summary)
	}
	fmt.Fprint(e.stdout, "\nWithout a command retryd serves. 'retryd help COMMAND' or 'retryd COMMAND --help'\n"+
		"shows a command's flags; 'retryd --version' prints the version.\n")
	return errHelpShown
}

// version prints "retryd VERSION": server.Version, stamped at build time
// from the VERSION file.
func version(_ context.Context, e *env, args []string) error {
	fs := newFlags("version")
	if err := e.parse(fs, args, false); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "retryd", server.Version)
	return nil
}
