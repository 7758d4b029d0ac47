package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
)

// deadAddr is a loopback host:port where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentAddr accepts connections and never answers, as a link-local
// address off a cloud often behaves.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return ln.Addr().String()
}

// TestDetectEvidence: a TPM first, then the GCE metadata server, then
// IMDSv2, against the loopback GCP and AWS fakes; nothing found is an
// error naming all three.
func TestDetectEvidence(t *testing.T) {
	gce := gcptest.NewServer(t, time.Now)
	imds := awstest.NewIMDS(awstest.Files{})
	defer imds.Close()
	refusing := awstest.NewIMDS(awstest.Files{})
	defer refusing.Close()
	refusing.RefuseTokens(http.StatusForbidden) // IMDSv1 only: not for the agent
	notGCE := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("some other web server"))
	}))
	defer notGCE.Close()

	tpmFile := filepath.Join(t.TempDir(), "tpmrm0")
	if err := os.WriteFile(tpmFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	noTPM := filepath.Join(t.TempDir(), "tpmrm0")
	dead := deadAddr(t)
	silent := silentAddr(t)

	cases := []struct {
		name      string
		o         DetectOptions
		want      attest.Kind
		wantTried int      // with want == "": the attempts listed
		mention   []string // what the error names
	}{
		{name: "TPM device", o: DetectOptions{TPMPath: tpmFile, GCEMetadataHost: gce.Host(), IMDSEndpoint: "http://" + dead}, want: attest.KindTPM},
		{name: "TPM device on EC2: its NitroTPM", o: DetectOptions{TPMPath: tpmFile, GCEMetadataHost: gce.Host(), IMDSEndpoint: imds.URL}, want: attest.KindNitroTPM},
		{name: "TPM device where IMDS refuses IMDSv2", o: DetectOptions{TPMPath: tpmFile, GCEMetadataHost: dead, IMDSEndpoint: refusing.URL}, want: attest.KindTPM},
		{name: "swtpm named by --tpm", o: DetectOptions{TPMPath: "tcp:127.0.0.1:1", GCEMetadataHost: gce.Host(), IMDSEndpoint: imds.URL}, want: attest.KindTPM},
		{name: "no TPM, GCE", o: DetectOptions{TPMPath: noTPM, GCEMetadataHost: gce.Host(), IMDSEndpoint: imds.URL}, want: attest.KindGCP},
		{name: "no TPM, not GCE, IMDSv2", o: DetectOptions{TPMPath: noTPM, GCEMetadataHost: dead, IMDSEndpoint: imds.URL}, want: attest.KindAWS},
		{name: "a web server that is not GCE's metadata server", o: DetectOptions{TPMPath: noTPM, GCEMetadataHost: strings.TrimPrefix(notGCE.URL, "http://"), IMDSEndpoint: imds.URL}, want: attest.KindAWS},
		{name: "a TPM path that is a directory", o: DetectOptions{TPMPath: t.TempDir(), GCEMetadataHost: dead, IMDSEndpoint: imds.URL}, want: attest.KindAWS},
		{name: "nothing", o: DetectOptions{TPMPath: noTPM, GCEMetadataHost: dead, IMDSEndpoint: "http://" + dead},
			wantTried: 3, mention: []string{noTPM, dead + "/computeMetadata/v1/", dead + "/latest/api/token"}},
		{name: "IMDS that refuses IMDSv2 tokens", o: DetectOptions{TPMPath: noTPM, GCEMetadataHost: dead, IMDSEndpoint: refusing.URL},
			wantTried: 3, mention: []string{refusing.URL, "403"}},
		{name: "metadata addresses that never answer", o: DetectOptions{TPMPath: noTPM, GCEMetadataHost: silent, IMDSEndpoint: "http://" + silent, Timeout: 300 * time.Millisecond},
			wantTried: 3, mention: []string{"no answer within 300ms"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			kind, why, err := DetectEvidence(context.Background(), tc.o)
			took := time.Since(start)
			if tc.want != "" {
				if err != nil || kind != tc.want {
					t.Fatalf("detected %q (%s), err %v; want %s", kind, why, err, tc.want)
				}
				if why == "" {
					t.Error("no description for the console")
				}
				return
			}
			var ne *NoEvidenceError
			if !errors.As(err, &ne) || len(ne.Tried) != tc.wantTried {
				t.Fatalf("detected %q, err %v; want a NoEvidenceError with %d attempts", kind, err, tc.wantTried)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("the error does not name %q: %v", m, err)
				}
			}
			// Two probes of 300ms each; a probe without its timeout
			// would wait for the TCP stack (minutes).
			if took > 10*time.Second {
				t.Errorf("took %s", took)
			}
		})
	}
}
