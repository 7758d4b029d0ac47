package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemo runs `make demo`'s flow on swtpm and checks its verdicts, so the
// demo cannot rot.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), Options{Dir: t.TempDir(), Out: &out, Clock: time.Now, Examples: "../../deploy/examples"})
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"EK trust               ca:swtpm-localca",
		"Secure Boot            on",
		"ALLOWED: worker",
		"REFUSED as expected: BootComponentNotAllowed",
		"REFUSED as expected: QuoteBindingMismatch",
		"Ignition got the PUBLIC tier",
		"verdict ALLOWED; NodeAttestation",
		"Ignition got the FULL config",
		"+ /etc/kubernetes/kubeconfig",
		"Approved (NodeproofAttestedTPM)",
		"REFUSED at attestation by the server (HTTP 403): SecureBootDisabled",
		"REFUSED as expected: SecureBootDisabled",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
