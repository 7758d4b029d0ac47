package agentcli

import (
	"bytes"
	"context"
	"encoding/pem"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
)

// TestEvidenceAuto: --evidence auto is the default; the command prints
// what it chose (or, finding nothing, everything it tried) before it
// contacts the server, which here is not there.
func TestEvidenceAuto(t *testing.T) {
	dir := t.TempDir()
	srv := httptest.NewTLSServer(nil)
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	gce := gcptest.NewServer(t, time.Now)
	imds := awstest.NewIMDS(awstest.Files{})
	defer imds.Close()
	noTPM := filepath.Join(dir, "no-tpm")

	cases := []struct {
		name       string
		gce, imds  string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
		wantNot    string // stdout must not hold this
	}{
		{name: "GCE", gce: gce.Host(), imds: "http://" + dead, args: []string{"--tpm", noTPM},
			wantCode: 1, wantStdout: "nodeproof-agent: evidence gcp (--evidence auto found the GCE metadata server at " + gce.Host() + ")"},
		{name: "AWS", gce: dead, imds: imds.URL, args: []string{"--tpm", noTPM},
			wantCode: 1, wantStdout: "nodeproof-agent: evidence aws (--evidence auto found IMDSv2 at " + imds.URL + ")"},
		{name: "swtpm named by --tpm", gce: gce.Host(), imds: imds.URL, args: []string{"--tpm", "tcp:" + dead},
			wantCode: 1, wantStdout: "nodeproof-agent: evidence tpm (", wantStderr: "nodeproof-agent: TPM: "},
		{name: "nothing", gce: dead, imds: "http://" + dead, args: []string{"--tpm", noTPM},
			wantCode: 1, wantStderr: "nodeproof-agent: no evidence detected: TPM: stat " + noTPM, wantNot: "attesting"},
		{name: "explicit evidence skips detection", gce: dead, imds: "http://" + dead, args: []string{"--tpm", noTPM, "--evidence", "gcp"},
			wantCode: 1, wantStdout: "attesting to https://" + dead + " for pool worker with gcp evidence", wantNot: "--evidence auto"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GCE_METADATA_HOST", tc.gce)
			t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", tc.imds)
			var stdout, stderr bytes.Buffer
			args := append([]string{"--server", "https://" + dead, "--ca-bundle", ca, "--timeout", "2s",
				"--kubelet-key", filepath.Join(t.TempDir(), "kubelet.key"), "--mode", "fetch", "--root", t.TempDir()}, tc.args...)
			code := Main(context.Background(), args, &stdout, &stderr)
			if code != tc.wantCode || !strings.Contains(stdout.String(), tc.wantStdout) || !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Fatalf("exit %d (want %d)\nstdout:\n%s\nstderr:\n%s\nwant stdout with %q, stderr with %q", code, tc.wantCode, &stdout, &stderr, tc.wantStdout, tc.wantStderr)
			}
			if tc.wantNot != "" && strings.Contains(stdout.String(), tc.wantNot) {
				t.Errorf("stdout holds %q:\n%s", tc.wantNot, &stdout)
			}
		})
	}
}

// TestHelp: -h exits 0 with the usage on standard output, every flag line
// of one name and at most one value word (a backtick pair in a usage text
// makes Go print the quoted words as the value's name).
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}} {
		var stdout, stderr bytes.Buffer
		if code := Main(context.Background(), args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d, want 0: %s", args, code, stderr.String())
		}
		out := stdout.String()
		if !strings.HasPrefix(out, "usage: nodeproof-agent --server URL") {
			t.Fatalf("%v: no usage line:\n%s", args, out)
		}
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if !strings.HasPrefix(l, "  -") {
				continue
			}
			n++
			if f := strings.Fields(l); len(f) > 2 {
				t.Errorf("garbled flag line %q", l)
			}
		}
		if n < 10 {
			t.Errorf("%v: %d flags listed:\n%s", args, n, out)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--frob"}, &stdout, &stderr); code != 2 || stdout.Len() != 0 || !strings.Contains(stderr.String(), "usage:") {
		t.Errorf("a bad flag: exit %d, stdout %q, stderr %q; want 2, nothing, the usage", code, stdout.String(), stderr.String())
	}
}

// TestServerMustBeHTTPS: a --server (agent.env NODEPROOF_SERVER) that is
// not https is refused before anything else, by a message that names the
// setting to fix.
func TestServerMustBeHTTPS(t *testing.T) {
	for _, server := range []string{"http://api-int.example.com:22623", "api-int.example.com:22623", "https://user:pw@api-int.example.com"} {
		t.Run(server, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), []string{"--server", server, "--ca-bundle", "/nonexistent", "--evidence", "tpm"}, &stdout, &stderr)
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s", code, &stderr)
			}
			for _, setting := range []string{"--server", "NODEPROOF_SERVER", "agent.env"} {
				if !strings.Contains(stderr.String(), setting) {
					t.Errorf("the message does not name %s: %s", setting, &stderr)
				}
			}
		})
	}
}

// TestUsageListsSources: -h lists every kind of evidence the agent can
// present (agent.SourceTable) in the usage line and in --evidence's help,
// with its description and when auto finds it, in the order auto tries
// them.
func TestUsageListsSources(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	rows := agent.SourceTable()
	if len(rows) == 0 {
		t.Fatal("no sources")
	}
	var kinds []string
	last := -1
	for _, r := range rows {
		kinds = append(kinds, string(r.Kind))
		entry := string(r.Kind) + " (" + r.Help + "; auto: when " + r.Auto + ")"
		i := strings.Index(out, entry)
		switch {
		case r.Help == "" || r.Auto == "":
			t.Errorf("source %s: no help or no auto", r.Kind)
		case i < 0:
			t.Errorf("the usage does not list %q:\n%s", entry, out)
		case i < last:
			t.Errorf("source %s listed out of SourceTable's order", r.Kind)
		}
		last = i
	}
	if line := "[--evidence auto|" + strings.Join(kinds, "|") + "]"; !strings.Contains(out, line) {
		t.Errorf("the usage line does not read %q:\n%s", line, out)
	}
}

// TestKubeletBootstrapCommand: the subcommand has its own usage and
// flags; a bad flag or argument is a usage error; with no bound key (no
// kubelet-client.key.tmp, no kept copy) it stops and says so, and writes
// nothing for the kubelet.
func TestKubeletBootstrapCommand(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		want     string
		toStdout bool
	}{
		{name: "help", args: []string{"-h"}, code: 0, want: "usage: nodeproof-agent kubelet-bootstrap", toStdout: true},
		{name: "a bad flag", args: []string{"--frob"}, code: 2, want: "usage: nodeproof-agent kubelet-bootstrap"},
		{name: "an argument", args: []string{"now"}, code: 2, want: "unexpected arguments"},
		{name: "no bound key", args: []string{"--node-name=n1", "--kubelet-key=" + dir + "/absent.key", "--bound-key=" + dir + "/absent-too.key",
			"--cert-dir=" + dir + "/pki", "--kubeconfig=" + dir + "/kubeconfig"}, code: 1, want: "no bound key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), append([]string{"kubelet-bootstrap"}, tc.args...), &stdout, &stderr)
			out := stderr.String()
			if tc.toStdout {
				out = stdout.String()
			}
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, want %d; %q lacks %q", code, tc.code, out, tc.want)
			}
		})
	}
	if _, err := os.Stat(dir + "/pki"); !os.IsNotExist(err) {
		t.Errorf("the certificate directory was made: %v", err)
	}
}

// TestParseFlags: both commands parse their flags alike (parseFlags): -h
// prints the command's usage and its flags to standard output and exits
// 0; a bad flag prints "NAME: " and the flag package's error, then the
// usage, to standard error and exits 2; an argument left over is named on
// standard error, exit 2, without the usage.
func TestParseFlags(t *testing.T) {
	const (
		main = "nodeproof-agent"
		kb   = "nodeproof-agent kubelet-bootstrap"
	)
	for _, tc := range []struct {
		name       string
		args       []string
		code       int
		wantStdout string // prefix; "" for none at all
		wantStderr string // prefix; "" for none at all
		wantUsage  bool   // the usage and flags follow on the same stream
	}{
		{name: "main -h", args: []string{"-h"}, code: 0, wantStdout: "usage: " + main + " --server URL", wantUsage: true},
		{name: "main --help", args: []string{"--help"}, code: 0, wantStdout: "usage: " + main + " --server URL", wantUsage: true},
		{name: "main bad flag", args: []string{"--frob"}, code: 2,
			wantStderr: main + ": flag provided but not defined: -frob\nusage: " + main + " --server URL", wantUsage: true},
		{name: "main bad value", args: []string{"--timeout", "soon"}, code: 2,
			wantStderr: main + `: invalid value "soon" for flag -timeout: parse error` + "\nusage: " + main + " --server URL", wantUsage: true},
		{name: "main argument", args: []string{"now"}, code: 2, wantStderr: main + `: unexpected arguments ["now"]` + "\n"},
		{name: "kubelet-bootstrap -h", args: []string{"kubelet-bootstrap", "-h"}, code: 0, wantStdout: "usage: " + kb + " [flags]", wantUsage: true},
		{name: "kubelet-bootstrap bad flag", args: []string{"kubelet-bootstrap", "--frob"}, code: 2,
			wantStderr: kb + ": flag provided but not defined: -frob\nusage: " + kb + " [flags]", wantUsage: true},
		{name: "kubelet-bootstrap bad value", args: []string{"kubelet-bootstrap", "--timeout", "soon"}, code: 2,
			wantStderr: kb + `: invalid value "soon" for flag -timeout: parse error` + "\nusage: " + kb + " [flags]", wantUsage: true},
		{name: "kubelet-bootstrap argument", args: []string{"kubelet-bootstrap", "now"}, code: 2, wantStderr: kb + `: unexpected arguments ["now"]` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), tc.args, &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			for _, s := range []struct {
				name, got, want string
			}{{"stdout", stdout.String(), tc.wantStdout}, {"stderr", stderr.String(), tc.wantStderr}} {
				switch {
				case s.want == "" && s.got != "":
					t.Errorf("%s: %q, want nothing", s.name, s.got)
				case !strings.HasPrefix(s.got, s.want):
					t.Errorf("%s: %q, want it to begin %q", s.name, s.got, s.want)
				case s.want == "":
				case tc.wantUsage && (!strings.Contains(s.got, "\n\nflags:\n  -") || !strings.Contains(s.got, "\n  -timeout duration\n")):
					t.Errorf("%s: no flags after the usage:\n%s", s.name, s.got)
				case !tc.wantUsage && s.got != s.want:
					t.Errorf("%s: %q, want exactly %q", s.name, s.got, s.want)
				}
			}
		})
	}
}
