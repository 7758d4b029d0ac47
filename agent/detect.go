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
	"github.com/nodeproof/nodeproof/identity/azuretpm"
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
	var kinds []string
	for _, r := range SourceTable() {
		kinds = append(kinds, string(r.Kind))
	}
	return "no evidence detected: " + strings.Join(e.Tried, "; ") + " (choose one with --evidence " + strings.Join(kinds, "|") + ")"
}

// DetectEvidence picks the evidence this machine can present: the first
// row of SourceTable whose detection finds it, strongest first. A TPM
// (the TPM device exists, or --tpm names swtpm) holding Google's AK
// template in NV → attest.KindGCEVTPM; a TPM with Azure's AK certificate
// NV index (0x01C101D0) defined → attest.KindAzureVTPM; a TPM device on a
// machine whose
// IMDSv2 answers → attest.KindNitroTPM; another TPM → attest.KindTPM;
// else the GCE metadata server answers as GCE's does (Metadata-Flavor:
// Google, the check cloud.google.com/go/compute/metadata's OnGCE makes,
// without its process-wide cache) → attest.KindGCP; else IMDS issues an
// IMDSv2 session token → attest.KindAWS. Each probe runs at most once.
// It returns what it found, for the console, or a *NoEvidenceError
// listing every probe that failed.
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
	d := &detecting{ctx: ctx, o: o,
		// Metadata requests never go through a proxy, nor follow a
		// redirect away from the metadata address.
		hc: &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, CheckRedirect: noRedirect}}
	for _, r := range SourceTable() {
		if r.detect == nil {
			continue
		}
		if found, ok := r.detect(d); ok {
			return r.Kind, found, nil
		}
	}
	return "", "", &NoEvidenceError{Tried: d.tried}
}

// detecting is one DetectEvidence: its probes, each run at most once,
// and what failed.
type detecting struct {
	ctx   context.Context
	o     DetectOptions
	hc    *http.Client
	tried []string

	tpmProbed bool
	tpm       string // where the TPM is, "" when none
	tpmNamed  bool   // --tpm names swtpm (tcp:HOST:PORT)
	vtpm      *bool  // the TPM holds Google's AK template
	azure     *bool  // the TPM holds Azure's AK certificate

	imdsProbed bool
	imdsErr    error
}

// theTPM is where this machine's TPM is ("" when none: why is tried),
// and whether --tpm named it (swtpm).
func (d *detecting) theTPM() (string, bool) {
	if d.tpmProbed {
		return d.tpm, d.tpmNamed
	}
	d.tpmProbed = true
	if addr, ok := strings.CutPrefix(d.o.TPMPath, "tcp:"); ok {
		d.tpm, d.tpmNamed = addr, true
		return d.tpm, true
	}
	fi, err := os.Stat(d.o.TPMPath)
	switch {
	case err == nil && !fi.IsDir():
		d.tpm = d.o.TPMPath
	case err == nil:
		d.tried = append(d.tried, "TPM: "+d.o.TPMPath+" is a directory")
	default:
		d.tried = append(d.tried, fmt.Sprintf("TPM: %v", err))
	}
	return d.tpm, false
}

// imdsv2 is nil when IMDS issues an IMDSv2 session token.
func (d *detecting) imdsv2() error {
	if d.imdsProbed {
		return d.imdsErr
	}
	d.imdsProbed = true
	tokenURL := strings.TrimRight(d.o.IMDSEndpoint, "/") + "/latest/api/token"
	d.imdsErr = probe(d.ctx, d.hc, d.o.Timeout, http.MethodPut, tokenURL, map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60"}, func(resp *http.Response, body []byte) error {
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			return fmt.Errorf("no IMDSv2 token (HTTP %d)", resp.StatusCode)
		}
		return nil
	})
	return d.imdsErr
}

// detectGCEVTPM: a TPM holding Google's AK template in NV.
func detectGCEVTPM(d *detecting) (string, bool) {
	at, named := d.theTPM()
	if at == "" {
		return "", false
	}
	if d.vtpm == nil {
		is := isGCEVTPM(d.o.TPMPath)
		d.vtpm = &is
	}
	if !*d.vtpm {
		return "", false
	}
	if named {
		return "a GCE vTPM (Google's AK template in NV) at " + at + " (named by --tpm)", true
	}
	return "a GCE vTPM (Google's AK template in NV) at " + at, true
}

// detectAzureVTPM: a TPM with Azure's AK certificate NV index defined
// (azuretpm.Detect).
func detectAzureVTPM(d *detecting) (string, bool) {
	at, named := d.theTPM()
	if at == "" {
		return "", false
	}
	if d.azure == nil {
		is := probeTPM(d.o.TPMPath, azuretpm.Detect)
		d.azure = &is
	}
	if !*d.azure {
		return "", false
	}
	if named {
		return "an Azure vTPM (its AK certificate in NV 0x01C101D0) at " + at + " (named by --tpm)", true
	}
	return "an Azure vTPM (its AK certificate in NV 0x01C101D0) at " + at, true
}

// detectNitroTPM: a TPM device on a machine whose IMDSv2 answers is an
// EC2 instance's NitroTPM (its EK has no certificate a vendor CA issued).
// A TPM --tpm names (swtpm) is never one.
func detectNitroTPM(d *detecting) (string, bool) {
	at, named := d.theTPM()
	if at == "" || named || d.imdsv2() != nil {
		return "", false
	}
	return "a TPM at " + at + " on EC2 (IMDSv2 at " + d.o.IMDSEndpoint + "): its NitroTPM", true
}

// detectTPM: any other TPM.
func detectTPM(d *detecting) (string, bool) {
	at, named := d.theTPM()
	switch {
	case at == "":
		return "", false
	case named:
		return "the TPM at " + at + " (named by --tpm)", true
	}
	return "a TPM at " + at, true
}

// detectGCP: the GCE metadata server answers as GCE's does.
func detectGCP(d *detecting) (string, bool) {
	gceURL := "http://" + strings.TrimRight(d.o.GCEMetadataHost, "/") + "/computeMetadata/v1/"
	err := probe(d.ctx, d.hc, d.o.Timeout, http.MethodGet, gceURL, map[string]string{"Metadata-Flavor": "Google"}, func(resp *http.Response, _ []byte) error {
		if resp.Header.Get("Metadata-Flavor") != "Google" {
			return fmt.Errorf("answered %d without Metadata-Flavor: Google", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		d.tried = append(d.tried, fmt.Sprintf("GCE metadata server %s: %v", gceURL, err))
		return "", false
	}
	return "the GCE metadata server at " + d.o.GCEMetadataHost, true
}

// detectAWS: IMDS issues an IMDSv2 session token.
func detectAWS(d *detecting) (string, bool) {
	if err := d.imdsv2(); err != nil {
		d.tried = append(d.tried, fmt.Sprintf("EC2 IMDSv2 %s: %v", strings.TrimRight(d.o.IMDSEndpoint, "/")+"/latest/api/token", err))
		return "", false
	}
	return "IMDSv2 at " + d.o.IMDSEndpoint, true
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
func isGCEVTPM(path string) bool { return probeTPM(path, gcevtpm.Detect) }

// probeTPM reports what the detection is finds on the TPM at path; false
// when the TPM does not open.
func probeTPM(path string, is func(io.ReadWriter) bool) bool {
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
		return is(rw)
	}
	defer ch.Close()
	return is(ch)
}
