package cli

import (
	"flag"
	"io"
	"testing"
)

// TestKubeconfigFromEnv: $KUBECONFIG is honoured as kubectl honours it,
// unless the command line names what to work on.
func TestKubeconfigFromEnv(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"env alone", nil, "/k/admin", "/k/admin"},
		{"a list: the first", nil, "/k/a:/k/b", "/k/a"},
		{"--kubeconfig wins", []string{"--kubeconfig", "/flag"}, "/k/admin", "/flag"},
		{"--state-dir names the directory", []string{"--state-dir", "/s"}, "/k/admin", ""},
		{"--server-basedir names the directory", []string{"--server-basedir", "/b"}, "/k/admin", ""},
		{"no env", nil, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var kc, sd, bd string
			fs.StringVar(&kc, "kubeconfig", "", "")
			fs.StringVar(&sd, "state-dir", "/var/lib/nodeproof", "")
			fs.StringVar(&bd, "server-basedir", "", "")
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			if err := kubeconfigFromEnv(fs, func(string) string { return c.env }); err != nil {
				t.Fatal(err)
			}
			if kc != c.want {
				t.Errorf("--kubeconfig %q; want %q", kc, c.want)
			}
		})
	}
}
