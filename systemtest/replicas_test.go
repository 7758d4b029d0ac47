package systemtest_test

import (
	"bytes"
	"context"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store/kubestore"
	"github.com/nodeproof/nodeproof/systemtest"
)

// roundRobin sends each request to the next replica, and keeps the bodies
// of verify requests (to replay them).
type roundRobin struct {
	mu       sync.Mutex
	hosts    []string
	next     int
	base     http.RoundTripper
	verifies [][]byte
}

func (r *roundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	host := r.hosts[r.next%len(r.hosts)]
	r.next++
	r.mu.Unlock()
	if req.URL.Path == api.PathVerify {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.verifies = append(r.verifies, b)
		r.mu.Unlock()
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	req = req.Clone(req.Context())
	req.URL.Host, req.Host = host, host
	return r.base.RoundTrip(req)
}

// TestReplicasAndApproverAttacks: three `nodeproof serve` replicas in cluster
// mode share one API server (the kubernetes store), one keyring, one
// provisioning token file and one serving certificate; a challenge from
// one is answered at another, a replay at the third is refused, a config
// token spent at one is refused at another; Ignition fetches the full
// config; the kubelet's CSR, made with the attested key through the
// bootstrap token the config carried, is approved by `nodeproof approve`
// running under its RBAC; a node revoked after its verify is refused its
// config at every replica (attack rows: `make attacks` runs this test).
func TestReplicasAndApproverAttacks(t *testing.T) {
	// A deployed cluster (the example pools, deploy/'s RBAC) and a vendor.
	w := systemtest.New(t, "..", systemtest.Options{Cluster: true, TPM: true,
		Policy: func(w *systemtest.World) *policytest.Builder { return e2ePolicy(w.EKRoots) }})
	cfg, kc, man := w.Config, w.KC, w.Manufacturer
	ctx := context.Background()
	kubeconfig, tokenDir, policyFile := w.Admin, w.TokenDir, w.PolicyFile

	// What replicas share: keys, tokens, certificate (Secrets in a cluster).
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared")
	os.Mkdir(shared, 0o700)
	st, err := certs.Ensure(filepath.Join(shared, "certs"), certs.Options{Clock: time.Now, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	logs := new(testenv.LockedBuffer)
	var hosts []string
	for i := range 3 {
		sctx, cancel := context.WithCancel(ctx)
		ready := make(chan net.Addr, 1)
		done := make(chan error, 1)
		go func() {
			done <- serve.Run(sctx, serve.Config{
				Listen: "127.0.0.1", TLSMinVersion: "VersionTLS12",
				CertFile: st.ServingCertFile, KeyFile: st.ServingKeyFile,
				Kubeconfig: kubeconfig, APIServerURL: cfg.Host, TokenDir: tokenDir,
				TokenStore: "file",
				KeysFile:   filepath.Join(shared, "keys.json"), TokensFile: filepath.Join(shared, "tokens.json"),
				Policy: policyFile, StateDir: filepath.Join(dir, fmt.Sprintf("replica-%d", i)), Hosts: []string{"127.0.0.1"},
				TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: time.Second, Clock: time.Now,
				Log:   slog.New(slog.NewJSONHandler(logs, nil)).With("replica", i),
				Ready: func(a, _ net.Addr) { ready <- a },
			})
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("replica %d: %v", i, err)
			}
		})
		select {
		case a := <-ready:
			hosts = append(hosts, a.String())
		case err := <-done:
			done <- err
			t.Fatalf("replica %d: %v\n%s", i, err, logs)
		case <-time.After(30 * time.Second):
			t.Fatalf("replica %d did not start", i)
		}
	}

	// The approver, from its command's code, as its service account.
	actx, acancel := context.WithCancel(ctx)
	adone := make(chan error, 1)
	go func() {
		adone <- cli.Approve(actx, cli.ApproveConfig{
			Kubeconfig: w.Approver, StoreNamespace: "nodeproof",
			LeaderElect: true, LeaseNamespace: "nodeproof", Identity: "approver-0",
			QPS: 50, Burst: 100, Clock: time.Now, Log: slog.New(slog.NewJSONHandler(logs, nil)).With("component", "approver"),
		})
	}()
	t.Cleanup(func() {
		acancel()
		if err := <-adone; err != nil {
			t.Errorf("approve: %v", err)
		}
	})

	// Wait for the cluster inputs at every replica.
	for _, h := range hosts {
		ac, err := agent.NewClient("https://"+h, st.CABundlePEM)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			resp, err := ac.HTTP.Get("https://" + h + "/config/worker")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %s does not serve the worker pool: %v\n%s", h, err, logs)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	m, err := man.NewMachine(ctx, t.TempDir(), firmwaretestdata.MustLog("rhel8-uefi"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rr := &roundRobin{hosts: hosts}
	ac, err := agent.NewClient("https://"+hosts[0], st.CABundlePEM)
	if err != nil {
		t.Fatal(err)
	}
	rr.base, ac.HTTP.Transport = ac.HTTP.Transport, rr

	var vr *api.VerifyResponse
	t.Run("challenge at one replica, verify at another", func(t *testing.T) {
		vr, err = ac.AttestTPM(ctx, "worker", "worker-7", m.Collector, m.KubeletDER)
		if err != nil {
			t.Fatalf("attest across replicas: %v\n%s", err, logs)
		}
	})
	if vr == nil {
		t.FailNow()
	}
	t.Run("the same verify at another replica before the config was delivered answers with the same record (a lost answer)", func(t *testing.T) {
		resp, err := rr.base.RoundTrip(mustRequest(t, "https://"+hosts[1]+api.PathVerify, rr.verifies[0]))
		if err != nil {
			t.Fatal(err)
		}
		var again api.VerifyResponse
		err = json.NewDecoder(resp.Body).Decode(&again)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil || again.Record != vr.Record {
			t.Fatalf("verify again: %d %+v %v; want record %s", resp.StatusCode, again, err, vr.Record)
		}
	})
	var served []byte
	t.Run("Ignition fetches with the config token; a second use at another replica is refused", func(t *testing.T) {
		tokFile := filepath.Join(t.TempDir(), "token")
		os.WriteFile(tokFile, []byte(vr.ConfigToken), 0o600)
		pointer := filepath.Join(t.TempDir(), "pointer.ign")
		var stderr bytes.Buffer
		if code := cli.Run(ctx, []string{"pointer", "--url", "https://" + hosts[1], "--ca-bundle", st.CABundleFile, "--pool", "worker",
			"--token-file", tokFile, "--http-total", "15s", "-o", pointer}, io.Discard, &stderr); code != 0 {
			t.Fatal(stderr.String())
		}
		cached, out, err := ignitionFetch(t, pointer)
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, out)
		}
		served = cached
		other, err := agent.NewClient("https://"+hosts[2], st.CABundlePEM)
		if err != nil {
			t.Fatal(err)
		}
		_, err = other.FetchConfig(ctx, "worker", vr.ConfigToken)
		if r, ok := err.(*agent.Refused); !ok || r.Refusal.Reason != attest.ReasonTokenUsed {
			t.Fatalf("second use of the config token: %v", err)
		}
	})
	if served == nil {
		t.FailNow()
	}
	t.Run("the same verify at the third replica, after the config was delivered, is refused", func(t *testing.T) {
		resp, err := rr.base.RoundTrip(mustRequest(t, "https://"+hosts[2]+api.PathVerify, rr.verifies[0]))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !bytes.Contains(body, []byte(attest.ReasonSessionReused)) {
			t.Fatalf("replayed verify: %d %s", resp.StatusCode, body)
		}
	})
	t.Run("the kubelet's CSR with the attested key is approved", func(t *testing.T) {
		rc := servedKubeconfig(t, served)
		if _, err := clustertest.WaitWhoAmI(ctx, rc, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		nkc, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		data, err := cert.MakeCSR(m.Kubelet, &pkix.Name{Organization: []string{"system:nodes"}, CommonName: "system:node:" + vr.NodeName}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		name, _, err := csr.RequestCertificate(nkc, data, "", certv1.KubeAPIServerClientKubeletSignerName, nil,
			[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, m.Kubelet)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			got, err := kc.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Status.Conditions) > 0 {
				cond := got.Status.Conditions[0]
				if cond.Type != certv1.CertificateApproved || cond.Reason != "NodeproofAttestedTPM" || !strings.Contains(cond.Message, vr.Record) {
					t.Fatalf("CSR decided %s %s: %s", cond.Type, cond.Reason, cond.Message)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CSR %s not decided\n%s", name, logs)
			}
			time.Sleep(100 * time.Millisecond)
		}
		kcl, err := kubestore.NewClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ks, err := kubestore.New(kcl, "nodeproof", time.Now)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := ks.GetRecord(ctx, vr.Record)
		if err != nil || rec.ConsumedAt == nil {
			t.Fatalf("record %s not consumed: %+v %v", vr.Record, rec, err)
		}
	})
	t.Run("a node revoked after its verify is refused its config at every replica", func(t *testing.T) {
		revokedAtEveryReplica(t, ctx, man, ac, hosts, st.CABundlePEM, kubeconfig, logs)
	})
}

// revokedAtEveryReplica: a machine attests, an operator revokes its node
// before it fetched; its config token is then refused Revoked at every
// replica, though each reads bindings from a watch of its own
// (kubestore.Watched). Each replica is asked with HEAD (which spends
// nothing) until its watch has the revocation, then with GET.
func revokedAtEveryReplica(t *testing.T, ctx context.Context, man *swtpm.Manufacturer, ac *agent.Client, hosts []string, caPEM []byte, kubeconfig string, logs fmt.Stringer) {
	m, err := man.NewMachine(ctx, t.TempDir(), firmwaretestdata.MustLog("rhel8-uefi"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	vr, err := ac.AttestTPM(ctx, "worker", "worker-8", m.Collector, m.KubeletDER)
	if err != nil {
		t.Fatalf("attest: %v\n%s", err, logs)
	}
	var stderr bytes.Buffer
	if code := cli.Run(ctx, []string{"revoke", "--store", "kubernetes", "--kubeconfig", kubeconfig, "--reason", "stolen", vr.NodeName}, io.Discard, &stderr); code != 0 {
		t.Fatalf("revoke: %s", stderr.String())
	}
	for i, h := range hosts {
		c, err := agent.NewClient("https://"+h, caPEM)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodHead, "https://"+h+api.PathConfig+"worker", nil)
			req.Header.Set("Authorization", "Bearer "+vr.ConfigToken)
			req.Header.Set("Accept", api.IgnitionAccept)
			resp, err := c.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusForbidden {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d still answers HEAD %d for a node revoked 10 s ago\n%s", i, resp.StatusCode, logs)
			}
		}
		_, err = c.FetchConfig(ctx, "worker", vr.ConfigToken)
		got := "served"
		if r, ok := err.(*agent.Refused); ok {
			got = fmt.Sprintf("%d %s", r.Status, r.Refusal.Reason)
		} else if err != nil {
			got = err.Error()
		}
		attacktable.Check(t, "lifetime", fmt.Sprintf("a config token fetched after its node was revoked, at replica %d of 3 (each reads bindings from its own watch)", i+1),
			fmt.Sprintf("403 %s", attest.ReasonRevoked), got)
	}
}

func mustRequest(t *testing.T, url string, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}
