package agentcli

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// parseFlags parses args into fs, the flag set of the command fs.Name()
// ("nodeproof-agent", "nodeproof-agent kubelet-bootstrap"), whose usage
// is head, then "flags:" and the flags' defaults. It returns whether the
// command goes on and, when it does not, the exit code: -h or --help
// prints the usage to stdout (0); a bad flag prints "NAME: the error" and
// the usage to stderr (2); an argument left after the flags prints
// "NAME: unexpected arguments" to stderr (2).
func parseFlags(fs *flag.FlagSet, head string, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), head+"\nflags:\n")
		fs.PrintDefaults()
	}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.Usage()
			return 0, false
		}
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		fs.SetOutput(stderr)
		fs.Usage()
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return 2, false
	}
	return 0, true
}
