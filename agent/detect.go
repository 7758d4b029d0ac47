package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
)

// DetectOptions say where DetectEvidence looks.
type DetectOptions struct {
	// TPMPath is the TPM (DefaultTPMPath); a "tcp:HOST:PORT" path (swtpm)
	// names a TPM explicitly and counts as present.
	TPMPath string
	// GCEMetadataHost is the GCE metadata server's host[:port]
	// (GCE_METADATA_HOST; default 169.254.169.254).
	GCEMetadataHost string
	// IMDSEndpoint is the EC2 instance metadata service's base URL
	// (AWS_EC2_METADATA_SERVICE_ENDPOINT; default http://169.254.169.254).
	IMDSEndpoint string
	// Timeout bounds each metadata probe (default 2s): off a cloud the
	// link-local address often just drops packets.
	Timeout time.Duration
}

// Defaults of DetectOptions.
const (
	DefaultTPMPath         = "/dev/tpmrm0"
	DefaultGCEMetadataHost = "169.254.169.254"
	DefaultIMDSEndpoint    = "http://169.254.169.254"
	DefaultDetectTimeout   = 2 * time.Second
)

// NoEvidenceError is DetectEvidence finding nothing; Tried says what it
// tried and why each failed.
type NoEvidenceError struct{ Tried []string }

func (e *NoEvidenceError) Error() string {
	return "no evidence detected: " + strings.Join(e.Tried, "; ") + " (choose one with --evidence tpm|gcp|aws)"
}

// DetectEvidence picks the evidence this machine can present, strongest
// first: a TPM (the TPM device exists, or --tpm names swtpm) holding
// Google's AK template in NV → attest.KindGCEVTPM; a TPM device on a
// machine whose IMDSv2 answers → attest.KindNitroTPM; another TPM →
// attest.KindTPM; else the GCE
// metadata server answers as GCE's does (Metadata-Flavor: Google, the
// check cloud.google.com/go/compute/metadata's OnGCE makes, without its
// process-wide cache) → attest.KindGCP; else IMDS issues an IMDSv2
// session token → attest.KindAWS. It returns what it found, for the
// console, or a *NoEvidenceError listing everything tried.
func DetectEvidence(ctx context.Context, o DetectOptions) (attest.Kind, string, error) {
	if o.TPMPath == "" {
		o.TPMPath = DefaultTPMPath
	}
	if o.GCEMetadataHost == "" {
		o.GCEMetadataHost = DefaultGCEMetadataHost
	}
	if o.IMDSEndpoint == "" {
		o.IMDSEndpoint = DefaultIMDSEndpoint
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultDetectTimeout
	}
	var tried []string

	// Metadata requests never go through a proxy, nor follow a redirect
	// away from the metadata address.
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, CheckRedirect: noRedirect}
	tokenURL := strings.TrimRight(o.IMDSEndpoint, "/") + "/latest/api/token"
	imdsv2 := func() error {
		return probe(ctx, hc, o.Timeout, http.MethodPut, tokenURL, map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60"}, func(resp *http.Response, body []byte) error {
			if resp.StatusCode != http.StatusOK || len(body) == 0 {
				return fmt.Errorf("no IMDSv2 token (HTTP %d)", resp.StatusCode)
			}
			return nil
		})
	}

	if addr, ok := strings.CutPrefix(o.TPMPath, "tcp:"); ok {
		if isGCEVTPM(o.TPMPath) {
			return attest.KindGCEVTPM, "a GCE vTPM (Google's AK template in NV) at " + addr + " (named by --tpm)", nil
		}
		return attest.KindTPM, "the TPM at " + addr + " (named by --tpm)", nil
	}
	fi, err := os.Stat(o.TPMPath)
	switch {
	case err == nil && !fi.IsDir():
		if isGCEVTPM(o.TPMPath) {
			return attest.KindGCEVTPM, "a GCE vTPM (Google's AK template in NV) at " + o.TPMPath, nil
		}
		// A TPM on a machine whose IMDSv2 answers is an EC2 instance's
		// NitroTPM: its EK has no certificate a vendor CA issued.
		if imdsv2() == nil {
			return attest.KindNitroTPM, "a TPM at " + o.TPMPath + " on EC2 (IMDSv2 at " + o.IMDSEndpoint + "): its NitroTPM", nil
		}
		return attest.KindTPM, "a TPM at " + o.TPMPath, nil
	case err == nil:
		tried = append(tried, "TPM: "+o.TPMPath+" is a directory")
	default:
		tried = append(tried, fmt.Sprintf("TPM: %v", err))
	}

	gceURL := "http://" + strings.TrimRight(o.GCEMetadataHost, "/") + "/computeMetadata/v1/"
	err = probe(ctx, hc, o.Timeout, http.MethodGet, gceURL, map[string]string{"Metadata-Flavor": "Google"}, func(resp *http.Response, _ []byte) error {
		if resp.Header.Get("Metadata-Flavor") != "Google" {
			return fmt.Errorf("answered %d without Metadata-Flavor: Google", resp.StatusCode)
		}
		return nil
	})
	if err == nil {
		return attest.KindGCP, "the GCE metadata server at " + o.GCEMetadataHost, nil
	}
	tried = append(tried, fmt.Sprintf("GCE metadata server %s: %v", gceURL, err))

	if err = imdsv2(); err == nil {
		return attest.KindAWS, "IMDSv2 at " + o.IMDSEndpoint, nil
	}
	tried = append(tried, fmt.Sprintf("EC2 IMDSv2 %s: %v", tokenURL, err))
	return "", "", &NoEvidenceError{Tried: tried}
}

// probe makes one request within timeout and lets check judge the answer.
func probe(ctx context.Context, hc *http.Client, timeout time.Duration, method, url string, header map[string]string, check func(*http.Response, []byte) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue interface{ Timeout() bool }
		if errors.As(err, &ue) && ue.Timeout() {
			return fmt.Errorf("no answer within %s", timeout)
		}
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	return check(resp, body)
}

// isGCEVTPM reports whether the TPM at path holds Google's AK template in
// NV (gcevtpm.Detect); a TPM that does not open is not one (its collector
// says why).
func isGCEVTPM(path string) bool {
	ch, err := openChannel(SourceOptions{TPMPath: path})
	if err != nil {
		return false
	}
	if ch == nil {
		rw, err := tpm2.OpenTPM(path)
		if err != nil {
			return false
		}
		defer rw.Close()
		return gcevtpm.Detect(rw)
	}
	defer ch.Close()
	return gcevtpm.Detect(ch)
}
