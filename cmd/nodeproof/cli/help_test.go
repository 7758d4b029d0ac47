package cli

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

// flagLine is how flag.PrintDefaults starts a flag's line: the name and, for
// a flag with a value, one word naming it. A usage text with a backtick
// pair makes Go take the quoted words as the value's name (garbled).
var flagLine = regexp.MustCompile(`^  -[a-z0-9][a-z0-9-]*( [a-zA-Z0-9_.:=|,<>/-]+)?$`)

// TestHelp: every command, and every action of every command, answers -h
// (and help CMD [ACTION]) with exit 0 and, on standard output, a usage line
// that shows its actions and positional arguments; no flag line is garbled.
func TestHelp(t *testing.T) {
	type helpCase struct {
		name      string
		args      []string
		usage     string   // the usage line's start
		mentions  []string // what the usage line must show
		actionsOf *command // its actions must be listed
	}
	var cases []helpCase
	cmds := commands()
	for i := range cmds {
		c := &cmds[i]
		line := "usage: nodeproof " + c.name
		var mentions []string
		if c.args != "" {
			mentions = append(mentions, c.args)
		}
		if len(c.actions) > 0 {
			mentions = append(mentions, c.actionNames())
		}
		words := strings.Fields(c.name) // dev tpm: two words
		with := func(args ...string) []string { return append(append([]string(nil), words...), args...) }
		cases = append(cases,
			helpCase{c.name + " -h", with("-h"), line, mentions, c},
			helpCase{"help " + c.name, append([]string{"help"}, words...), line, mentions, c},
			helpCase{c.name + " --help", with("--help"), line, mentions, c})
		for _, alias := range c.aliases {
			cases = append(cases, helpCase{alias + " -h", []string{alias, "-h"}, line, mentions, c})
		}
		for _, a := range c.actions {
			if a.run != nil {
				var m []string
				if a.args != "" {
					m = append(m, a.args)
				}
				cases = append(cases,
					helpCase{c.name + " " + a.name + " -h", with(a.name, "-h"), line + " " + a.name, m, nil},
					helpCase{"help " + c.name + " " + a.name, append(append([]string{"help"}, words...), a.name), line + " " + a.name, m, nil})
				continue
			}
			cases = append(cases, helpCase{c.name + " " + a.name + " -h", with(a.name, "-h"), line, mentions, c})
		}
	}
	if len(cases) < 40 {
		t.Fatalf("only %d help cases: the command table lost commands", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := Run(context.Background(), tc.args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
			}
			out := stdout.String()
			first, _, _ := strings.Cut(out, "\n")
			if !strings.HasPrefix(first, tc.usage) {
				t.Fatalf("usage line %q does not start %q", first, tc.usage)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(first, m) {
					t.Errorf("usage line %q does not show %q", first, m)
				}
			}
			if tc.actionsOf != nil {
				for _, a := range tc.actionsOf.actions {
					if !strings.Contains(out, "\n  "+a.name) {
						t.Errorf("the actions listed lack %q:\n%s", a.name, out)
					}
				}
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "  -") && !flagLine.MatchString(l) {
					t.Errorf("garbled flag line %q", l)
				}
			}
			if strings.Count(out, "nodeproof nodeproof") > 0 {
				t.Errorf("doubled prefix:\n%s", out)
			}
		})
	}
}

// TestUsageErrors: a command line that does not fit the usage exits 2 with
// the error and the usage on standard error, nothing on standard output.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no command", nil},
		{"unknown command", []string{"frobnicate"}},
		{"release without NODE", []string{"release"}},
		{"revoke with two NODEs", []string{"revoke", "a", "b"}},
		{"policy without action", []string{"policy"}},
		{"policy unknown action", []string{"policy", "frob"}},
		{"keys without action", []string{"keys"}},
		{"token unknown action", []string{"token", "frob"}},
		{"unknown flag", []string{"ca", "--frob"}},
		{"inspect three words", []string{"inspect", "a", "b", "c"}},
		{"dev without a command", []string{"dev"}},
		{"dev tpm without an action", []string{"dev", "tpm"}},
		{"dev tpm start without --dir", []string{"dev", "tpm", "start"}},
		{"pointer without --url", []string{"pointer"}},
		{"policy learn without --pool", []string{"policy", "learn", "--event-log", "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := Run(context.Background(), tc.args, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2\nstderr:\n%s", code, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("standard output: %q", stdout.String())
			}
			if !strings.Contains(stderr.String(), "usage: nodeproof") {
				t.Errorf("no usage on standard error:\n%s", stderr.String())
			}
		})
	}
}

// TestSharedFlagsAgree: a flag that serve and another command both have is
// one setting: the same default in both (docs/cli.md), so an admin command
// given the deployment's flags finds what serve keeps where serve keeps it.
// And the old second name of the token Secret's namespace is gone.
func TestSharedFlagsAgree(t *testing.T) {
	defaults := func(args ...string) map[string]string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := Run(context.Background(), append(args, "-h"), &stdout, &stderr); code != 0 {
			t.Fatalf("%v -h: exit %d", args, code)
		}
		out := map[string]string{}
		var name string
		for _, l := range strings.Split(stdout.String(), "\n") {
			if strings.HasPrefix(l, "  -") {
				name = strings.Fields(l)[0][1:]
				out[name] = ""
				continue
			}
			if name != "" {
				if i := strings.LastIndex(l, "(default "); i >= 0 && strings.HasSuffix(l, ")") {
					out[name] = l[i+len("(default ") : len(l)-1]
				}
			}
		}
		return out
	}
	serve := defaults("serve")
	checked := 0
	cmds := commands()
	for i := range cmds {
		c := &cmds[i]
		invocations := [][]string{strings.Fields(c.name)}
		for _, a := range c.actions {
			if a.run != nil {
				invocations = append(invocations, append(strings.Fields(c.name), a.name))
			}
		}
		for _, args := range invocations {
			if args[0] == "serve" || args[0] == "approve" {
				continue // approve is a server of its own: its port and API budget are its settings
			}
			for name, def := range defaults(args...) {
				if name == "namespace" {
					t.Errorf("%v has --namespace: the setting is --token-secret-namespace, as serve names it", args)
				}
				want, shared := serve[name]
				if !shared || name == "hosts" { // ca's --hosts: the certificate's own names by default
					continue
				}
				checked++
				if def != want {
					t.Errorf("%v --%s defaults to %q, serve's to %q: one setting, one default", args, name, def, want)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d shared flags compared", checked)
	}
}
