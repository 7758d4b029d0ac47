package demo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/cli"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/mcs/certs"
)

// Examples is where the example inputs are, relative to the module root.
const Examples = "deploy/examples"

const serverPolicy = `apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
trust:
  ekRoots:
  - {name: swtpm-localca, dir: %s}
pools:
  worker:
    evidence: [tpm]
    tpm: {ekTrust: [ca:swtpm-localca], requireSecureBoot: true}
    serve: {nodeNames: requested}
`

// ignitionAccept is what Ignition v2.24 sends.
const ignitionAccept = "application/vnd.coreos.ignition+json;version=3.5.0, */*;q=0.1"

// runServer is part two.
func runServer(ctx context.Context, o Options, man *swtpm.Manufacturer, roots string, step, info func(string, ...any)) error {
	examples := o.Examples
	if examples == "" {
		examples = Examples
	}
	state := filepath.Join(o.Dir, "server")
	policyFile := filepath.Join(o.Dir, "policy.yaml")
	if err := os.WriteFile(policyFile, fmt.Appendf(nil, serverPolicy, roots), 0o600); err != nil {
		return err
	}
	step("The Machine Config Server starts on the example MachineConfigs (%s/bootstrap)", examples)
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- cli.Serve(sctx, cli.ServeConfig{
			Listen: "127.0.0.1", TLSMinVersion: "VersionTLS12",
			ServerBasedir: filepath.Join(examples, "bootstrap"), BootstrapKube: filepath.Join(examples, "bootstrap-kubeconfig"),
			Policy: policyFile, StateDir: state, Hosts: []string{"127.0.0.1"},
			TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: 10 * time.Second, Clock: o.Clock,
			Log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready: func(secure, _ net.Addr) { ready <- secure },
		})
	}()
	var url string
	select {
	case a := <-ready:
		url = "https://" + a.String()
	case err := <-done:
		return fmt.Errorf("server: %w", err)
	}
	defer func() { stop(); <-done }()
	bundle, err := os.ReadFile(filepath.Join(state, "certs", "current", certs.CABundleFileName))
	if err != nil {
		return err
	}
	info("listening on %s (TLS, HTTP/1.1 only); its own CA made in %s", url, filepath.Join(state, "certs"))

	step("Anyone on the network fetches /config/worker with no credentials")
	public, err := fetch(url, bundle, "")
	if err != nil {
		return err
	}
	info("got the PUBLIC tier: %d files", len(public))
	for _, f := range public {
		info("  %s", f)
	}

	step("A worker machine with a TPM attests to the server (swtpm, real RHEL 8 boot log)")
	m, err := man.NewMachine(ctx, filepath.Join(o.Dir, "machine-2"), firmwaretestdata.MustLog(o.Log))
	if err != nil {
		return err
	}
	defer m.Close()
	c, err := agent.NewClient(url, bundle)
	if err != nil {
		return err
	}
	vr, err := c.AttestTPM(ctx, "worker", "worker-1", m.Collector, m.KubeletDER)
	if err != nil {
		return err
	}
	info("verified: node %s, NodeAttestation record %s, config token valid until %s", vr.NodeName, vr.Record, vr.Expires.Format(time.RFC3339))

	step("It fetches /config/worker with its config token")
	full, err := fetch(url, bundle, vr.ConfigToken)
	if err != nil {
		return err
	}
	info("got the FULL config: %d files; these are what only an attested machine gets:", len(full))
	for _, f := range full {
		if !slices.Contains(public, f) {
			info("  + %s", f)
		}
	}
	if _, err := fetch(url, bundle, vr.ConfigToken); err != nil {
		info("the same token again: %v", err)
	}

	step("A machine that booted with Secure Boot off tries the same (real Ubuntu 21.04 log)")
	bad, err := man.NewMachine(ctx, filepath.Join(o.Dir, "machine-3"), firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot"))
	if err != nil {
		return err
	}
	defer bad.Close()
	_, err = c.AttestTPM(ctx, "worker", "worker-2", bad.Collector, bad.KubeletDER)
	info("REFUSED as expected: %v", err)
	if err == nil || !strings.Contains(err.Error(), "SecureBootDisabled") {
		return fmt.Errorf("the Secure Boot off machine was not refused for Secure Boot: %v", err)
	}
	step("Done: the public tier went to anyone, the full config only to the attested machine")
	return nil
}

// fetch gets /config/worker as Ignition does and lists the file paths.
func fetch(url string, bundle []byte, token string) ([]string, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, err := http.NewRequest(http.MethodGet, url+"/config/worker", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", ignitionAccept)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	var cfg struct {
		Storage struct {
			Files []struct {
				Path string `json:"path"`
			} `json:"files"`
		} `json:"storage"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, err
	}
	var paths []string
	for _, f := range cfg.Storage.Files {
		paths = append(paths, f.Path)
	}
	slices.Sort(paths)
	return paths, nil
}
