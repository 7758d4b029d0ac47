package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// command is one nodeproof command: how it is called, what it does, its
// actions, and what runs it. The table of them (commands) is the one place
// usage is built from: `nodeproof -h`, `nodeproof help CMD`, and `-h` of
// every command and action. docs/cli.md says how to add one.
type command struct {
	name    string
	aliases []string
	// args are the positional arguments after the name (and action), as
	// the usage line shows them: "NODE", "[NODE | pool NAME]"; "" none.
	args    string
	summary string // one line, for `nodeproof -h`
	// about is more, for `nodeproof NAME -h` (optional).
	about string
	// actions are the command's sub-actions. An action with its own run
	// has its own flags and must come right after the command's name
	// (`nodeproof policy check FILE`); actions without share the command's
	// flags and run, which gets the action as in.action, and may stand
	// among the flags (`nodeproof token --state-dir D rotate`).
	actions []action
	// defaultAction is the action run when none is given; "" makes one
	// required (when there are actions).
	defaultAction string
	run           func(ctx context.Context, in *invocation) error
}

// action is a command's sub-action.
type action struct {
	name    string
	args    string // positional arguments after the action's name
	summary string
	run     func(ctx context.Context, in *invocation) error // nil: the command's
}

// invocation is one run of a command: where it writes, its flags, and the
// usage they print.
type invocation struct {
	ctx            context.Context
	stdout, stderr io.Writer
	cmd            *command
	act            *action // nil: the command itself
	action         string  // the action named (or the default); "" for none
	args           []string
	fs             *flag.FlagSet
}

// errUsage is a command line that does not fit the usage, which Run has
// printed: exit status 2.
var errUsage = errors.New("usage")

// flags is the invocation's flag set, named after the command and action.
func (in *invocation) flags() *flag.FlagSet {
	if in.fs == nil {
		name := "nodeproof " + in.cmd.name
		if in.act != nil && in.act.run != nil {
			name += " " + in.act.name
		}
		in.fs = flag.NewFlagSet(name, flag.ContinueOnError)
		in.fs.SetOutput(io.Discard) // parse prints what it must, where it belongs
		in.fs.Usage = func() {}
	}
	return in.fs
}

// parse parses the flags, with positional arguments before, among or after
// them (`nodeproof release NODE --reason R`), and returns the positional
// ones (after "--", everything is positional). -h or --help prints the
// usage to standard output and returns flag.ErrHelp (exit 0); a bad flag
// prints the error and the usage to standard error. For a command whose
// actions share its flags, the first positional argument naming one of its
// actions is taken as the action (in.action), not returned.
func (in *invocation) parse() ([]string, error) {
	fs := in.flags()
	var pos []string
	args := in.args
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				in.printUsage(in.stdout)
				return nil, err
			}
			fmt.Fprintf(in.stderr, "%s: %v\n", fs.Name(), err)
			in.printUsage(in.stderr)
			return nil, errUsage
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if err := kubeconfigFromEnv(fs, os.Getenv); err != nil {
		return nil, in.usageError("%v", err)
	}
	if in.act == nil && len(in.cmd.actions) > 0 && len(pos) > 0 {
		if a := in.cmd.action(pos[0]); a != nil && a.run == nil {
			in.action, pos = a.name, pos[1:]
		}
	}
	if in.action == "" && in.act == nil && len(in.cmd.actions) > 0 {
		if in.cmd.defaultAction == "" {
			return nil, in.usageError("an action is required: %s", in.cmd.actionNames())
		}
		in.action = in.cmd.defaultAction
	}
	return pos, nil
}

// usageError prints the error and the usage to standard error; Run exits 2.
func (in *invocation) usageError(format string, args ...any) error {
	fmt.Fprintf(in.stderr, "%s: %s\n", in.flags().Name(), fmt.Sprintf(format, args...))
	in.printUsage(in.stderr)
	return errUsage
}

// exactly parses and requires n positional arguments, named by the usage.
func (in *invocation) exactly(n int) ([]string, error) {
	pos, err := in.parse()
	if err != nil {
		return nil, err
	}
	if len(pos) != n {
		want := in.cmd.args
		if in.act != nil {
			want = in.act.args
		}
		if n == 0 {
			return nil, in.usageError("unexpected arguments %q", pos)
		}
		return nil, in.usageError("want %s, got %d arguments %q", want, len(pos), pos)
	}
	return pos, nil
}

// usageLine is "nodeproof NAME [ACTION] ARGS [flags]".
func (in *invocation) usageLine() string {
	parts := []string{"nodeproof", in.cmd.name}
	args := in.cmd.args
	switch {
	case in.act != nil && in.act.run != nil:
		parts, args = append(parts, in.act.name), in.act.args
	case len(in.cmd.actions) > 0:
		names := in.cmd.actionNames()
		if in.cmd.defaultAction != "" {
			names = "[" + names + "]"
		}
		parts = append(parts, names)
	}
	if args != "" {
		parts = append(parts, args)
	}
	return strings.Join(append(parts, "[flags]"), " ")
}

// printUsage writes the usage line, what the command does, its actions
// and its flags.
func (in *invocation) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s\n", in.usageLine())
	if len(in.cmd.aliases) > 0 {
		fmt.Fprintf(w, "   (also: %s)\n", strings.Join(in.cmd.aliases, ", "))
	}
	summary, about := in.cmd.summary, in.cmd.about
	if in.act != nil && in.act.run != nil {
		summary, about = in.act.summary, ""
	}
	fmt.Fprintf(w, "\n%s\n", summary)
	if about != "" {
		fmt.Fprintf(w, "\n%s\n", about)
	}
	if len(in.cmd.actions) > 0 && (in.act == nil || in.act.run == nil) {
		in.cmd.printActions(w)
	}
	fs := in.flags()
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

// printActions lists the actions with their arguments and summaries.
func (c *command) printActions(w io.Writer) {
	fmt.Fprintln(w, "\nactions:")
	for _, a := range c.actions {
		name := a.name
		if a.args != "" {
			name += " " + a.args
		}
		def := ""
		if a.name == c.defaultAction {
			def = " (the default)"
		}
		fmt.Fprintf(w, "  %-22s %s%s\n", name, a.summary, def)
	}
	for _, a := range c.actions {
		if a.run != nil {
			fmt.Fprintf(w, "\n\"nodeproof %s ACTION -h\" lists an action's flags.\n", c.name)
			break
		}
	}
}

func (c *command) action(name string) *action {
	for i := range c.actions {
		if c.actions[i].name == name {
			return &c.actions[i]
		}
	}
	return nil
}

func (c *command) actionNames() string {
	var names []string
	for _, a := range c.actions {
		names = append(names, a.name)
	}
	return strings.Join(names, "|")
}

// runCommand runs c with args (after its name): an action with its own
// run when args start with one, else the command's run. An error comes
// back prefixed with what ran ("policy learn: ..."), once: a library's
// own prefix of the same words is not repeated.
func runCommand(ctx context.Context, c *command, args []string, stdout, stderr io.Writer) error {
	in := &invocation{ctx: ctx, stdout: stdout, stderr: stderr, cmd: c, args: args}
	err := runIn(ctx, in, c, args)
	if err == nil || errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsage) || errors.Is(err, errFailed) {
		return err
	}
	name := c.name
	if in.act != nil && in.act.run != nil {
		name += " " + in.act.name
	}
	if strings.HasPrefix(err.Error(), name+": ") {
		return err
	}
	return fmt.Errorf("%s: %w", name, err)
}

func runIn(ctx context.Context, in *invocation, c *command, args []string) error {
	run := c.run
	if len(args) > 0 {
		if a := c.action(args[0]); a != nil && a.run != nil {
			in.act, in.action, in.args, run = a, a.name, args[1:], a.run
		}
	}
	if run == nil {
		// Only actions with runs of their own: one must be named.
		if _, err := in.parse(); err != nil {
			return err
		}
		return in.usageError("an action is required: %s", c.actionNames())
	}
	return run(ctx, in)
}

// topUsage is `nodeproof -h`: every command, from the table.
func topUsage(w io.Writer, cmds []command) {
	fmt.Fprint(w, "usage: nodeproof <command> [flags]\n\ncommands:\n")
	for _, c := range cmds {
		line := c.name
		switch {
		case len(c.actions) > 0 && c.defaultAction != "":
			line += " [" + c.actionNames() + "]"
		case len(c.actions) > 0:
			line += " " + c.actionNames()
		}
		if c.args != "" {
			line += " " + c.args
		}
		fmt.Fprintf(w, "  %-34s %s\n", line, c.summary)
		if len(c.aliases) > 0 {
			fmt.Fprintf(w, "  %-34s (also: %s)\n", "", strings.Join(c.aliases, ", "))
		}
	}
	fmt.Fprint(w, "\n\"nodeproof <command> -h\" (or \"nodeproof help <command>\") shows a command's actions, arguments and flags.\n")
}

// lookup finds a command by name or alias.
func lookup(cmds []command, name string) *command {
	for i := range cmds {
		if cmds[i].name == name || slices.Contains(cmds[i].aliases, name) {
			return &cmds[i]
		}
	}
	return nil
}

// groupOf lists the commands whose first word is name (dev: dev tpm).
func groupOf(cmds []command, name string) []command {
	var out []command
	for _, c := range cmds {
		if strings.HasPrefix(c.name, name+" ") {
			out = append(out, c)
		}
	}
	return out
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// kubeconfigFromEnv honours $KUBECONFIG as kubectl does: a command with a
// --kubeconfig flag not given takes $KUBECONFIG, unless --state-dir or
// --server-basedir was given (those name the directory to work on, and
// win). The first path of a list is taken.
func kubeconfigFromEnv(fs *flag.FlagSet, getenv func(string) string) error {
	if fs.Lookup("kubeconfig") == nil {
		return nil
	}
	env := getenv("KUBECONFIG")
	if env == "" {
		return nil
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "kubeconfig", "state-dir", "server-basedir":
			explicit = true
		}
	})
	if explicit {
		return nil
	}
	first, _, _ := strings.Cut(env, string(os.PathListSeparator))
	return fs.Set("kubeconfig", first)
}
