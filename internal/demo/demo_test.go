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
		"got the PUBLIC tier",
		"+ /etc/kubernetes/kubeconfig",
		"the same token again: 403",
		"REFUSED as expected: server refused (403 SecureBootDisabled)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
