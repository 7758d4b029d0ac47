package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPointerRefusesABundleWithoutCertificates: a pointer config whose CA
// bundle is missing or broken would fail at the machine's first boot, so
// `nodeproof pointer` refuses it instead of writing one without a CA.
func TestPointerRefusesABundleWithoutCertificates(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, bundle, want string
	}{
		{"empty", "", "CA bundle: no PEM certificate"},
		{"white space", "\n \n", "CA bundle: no PEM certificate"},
		{"not PEM", "hello", "CA bundle: data that is not a PEM certificate"},
		{"a truncated certificate", "-----BEGIN CERTIFICATE-----\nMIIB\n", "CA bundle:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(f, []byte(tc.bundle), 0o600); err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			code := Run(context.Background(), []string{"pointer", "--url", "https://mcs.example:22623", "--ca-bundle", f}, io.Discard, &stderr)
			if code == 0 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want a refusal saying %q", code, stderr.String(), tc.want)
			}
		})
	}
}
