package cli

import (
	"flag"
	"io"
	"testing"

	"github.com/nodeproof/nodeproof/mcs/serve"
)

// TestLimitFlagDefaults: serve's --limit-* flags default to
// serve.DefaultLimits, and a value given lands in its field.
func TestLimitFlagDefaults(t *testing.T) {
	var c serve.LimitConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	limitFlags(fs, &c)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if c != serve.DefaultLimits() {
		t.Fatalf("flag defaults %+v differ from DefaultLimits %+v", c, serve.DefaultLimits())
	}
	if err := fs.Parse([]string{"--limit-per-identity", "often"}); err != nil || c.PerIdentity != "often" {
		t.Fatalf("--limit-per-identity often: %v, PerIdentity %q", err, c.PerIdentity)
	}
}
