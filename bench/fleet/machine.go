package fleet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	certv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// Machine is one simulated machine: its identity, its kubelet key, and
// what happened to it.
type Machine struct {
	Name string
	Kind attest.Kind
	// Source is the loopback address its connections come from.
	Source   string
	Evidence agent.Evidence
	Key      *ecdsa.PrivateKey
	Pub      []byte

	// Filled in by Provision.
	Start time.Time
	// Config is the time from Start to the full config in hand.
	Config time.Duration
	// Attestations is how many attestations it took (more than one when a
	// crash cost it its session or its config token).
	Attestations int
	NodeName     string
	Record       string
	ConfigToken  string
	CSRName      string
	// ticket is the server's AK ticket for a TPM machine's AK (its model
	// keeps the one AK, as the agent's --ak-state does): sent with each
	// re-attestation, kept from the one that activated a credential.
	ticket string
}

// Machines makes nTPM machines with software TPMs, nGCP with GCE
// metadata servers and nAWS with IMDSv2 services of their own; machine i
// is named prefix-i and connects from its own loopback address.
func (w *World) Machines(prefix string, nTPM, nGCP, nAWS int) ([]*Machine, error) {
	tpms, err := w.TPMMachines(nTPM)
	if err != nil {
		return nil, err
	}
	n := nTPM + nGCP + nAWS
	ms := make([]*Machine, 0, n)
	for i := range n {
		m := &Machine{Name: fmt.Sprintf("%s-%04d", prefix, i), Source: SourceAddr(i)}
		if m.Key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, err
		}
		if m.Pub, err = x509.MarshalPKIXPublicKey(&m.Key.PublicKey); err != nil {
			return nil, err
		}
		switch {
		case i < nTPM:
			m.Kind, m.Evidence = attest.KindTPM, agent.TPMEvidence{Collector: tpms[i]}
		case i < nTPM+nGCP:
			s := gcptest.NewServerWithKey(w.fakes, time.Now, w.gceKey)
			inst := s.Instance()
			inst.InstanceName, inst.InstanceID = m.Name, fmt.Sprint(4000000000000000000+i)
			s.SetInstance(inst)
			m.Kind, m.Evidence = attest.KindGCP, agent.GCPEvidence{Metadata: s.Client()}
		default:
			doc := awstest.NewDocument("us-east-1", time.Now().Add(-time.Minute))
			sum := sha256.Sum256([]byte(m.Name))
			doc.InstanceID = "i-" + hex.EncodeToString(sum[:])[:17]
			f, err := w.region.Files(doc)
			if err != nil {
				return nil, err
			}
			fake := awstest.NewIMDS(f)
			w.fakes.Cleanup(fake.Close)
			// IMDSv2 only, as the agent's client; but the SDK's default
			// timeouts (1 s dials, 3 attempts) are for a metadata service
			// on the instance, not for fifty in a process that shares two
			// cores with a thousand machines.
			client := imds.New(imds.Options{Endpoint: fake.URL, EnableFallback: awssdk.FalseTernary,
				HTTPClient: &http.Client{Timeout: time.Minute}})
			m.Kind, m.Evidence = attest.KindAWS, agent.AWSEvidence{IMDS: client}
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// SourceAddr is machine i's loopback address: 127.1.x.y, one per machine
// for 60,000 machines (per-source limits then see each on its own).
func SourceAddr(i int) string {
	return fmt.Sprintf("127.1.%d.%d", 1+i/250, 1+i%250)
}

// ProvisionOptions shape a machine's retries.
type ProvisionOptions struct {
	// MinBackoff and MaxBackoff bound the agent's waits (default 200 ms
	// and 2 s).
	MinBackoff, MaxBackoff time.Duration
}

// Provision is one machine coming up: it attests and fetches its full
// config as the agent does in fetch mode (agent.Client.AttestAndFetch:
// 5xx and no answer retried until ctx ends, a session expired meanwhile
// or a config token spent by a delivery that never arrived mended by
// attesting again, every verify proving the kubelet key), then submits
// its kubelet client CSR with the per-node bootstrap token the config
// carried, as the kubelet does. It returns when the CSR exists (Approvals
// says when it is approved).
func (w *World) Provision(ctx context.Context, m *Machine, o ProvisionOptions) error {
	if o.MinBackoff == 0 {
		o.MinBackoff, o.MaxBackoff = 200*time.Millisecond, 2*time.Second
	}
	m.Start = time.Now()
	c, err := agent.NewClient(w.URL, w.Bundle)
	if err != nil {
		return err
	}
	c.MinBackoff, c.MaxBackoff = o.MinBackoff, o.MaxBackoff
	c.KubeletKey = m.Key
	c.HTTP.Transport.(*http.Transport).DialContext = (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(m.Source)}, Timeout: 10 * time.Second,
	}).DialContext
	w.spreadClient(c.HTTP)
	vr, full, err := c.AttestAndFetch(ctx, m.Evidence, "worker", m.Name, m.Pub)
	m.Attestations = c.Challenges
	if vr != nil {
		m.NodeName, m.Record, m.ConfigToken = vr.NodeName, vr.Record, vr.ConfigToken
	}
	if err != nil {
		return fmt.Errorf("%s: %w", m.Name, err)
	}
	m.Config = time.Since(m.Start)
	return w.submitCSR(ctx, m, full, o)
}

// submitCSR creates the kubelet's client CSR with the bootstrap
// kubeconfig of the full config, under a name derived from the key (as
// the kubelet does, so a retried create finds its own CSR), retrying
// while the API server is unreachable or has not seen the new bootstrap
// token yet.
func (w *World) submitCSR(ctx context.Context, m *Machine, full []byte, o ProvisionOptions) error {
	kubeconfig, err := agent.ConfigFile(full, api.FirstBootFiles[0])
	if err != nil {
		return err
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst, rc.Timeout = 50, 100, 10*time.Second
	nkc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	data, err := cert.MakeCSR(m.Key, &pkix.Name{Organization: []string{"system:nodes"}, CommonName: "system:node:" + m.NodeName}, nil, nil)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(m.Pub)
	name := "node-csr-" + hex.EncodeToString(sum[:16])
	wait := o.MinBackoff
	for {
		got, _, err := csr.RequestCertificate(nkc, data, name, certv1.KubeAPIServerClientKubeletSignerName, nil,
			[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, m.Key)
		if err == nil {
			m.CSRName = got
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: CSR: %w", m.Name, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(wait*2, o.MaxBackoff)
	}
}

// short trims an error for a report line.
func short(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// Reattest is one re-attestation of a provisioned machine, as the agent's
// --mode reattest makes it (the same /attest/v1 exchange with purpose
// reattest, the kubelet key proven): nothing is released; the server
// records the outcome on the node's binding. It retries 5xx and lost
// connections until ctx ends, and returns the time it took. Its
// connection is closed when it returns, as the agent's exit closes it.
func (w *World) Reattest(ctx context.Context, m *Machine, o ProvisionOptions) (time.Duration, error) {
	if o.MinBackoff == 0 {
		o.MinBackoff, o.MaxBackoff = 200*time.Millisecond, 2*time.Second
	}
	if m.NodeName == "" {
		return 0, fmt.Errorf("%s: not provisioned", m.Name)
	}
	start := time.Now()
	c, err := agent.NewClient(w.URL, w.Bundle)
	if err != nil {
		return 0, err
	}
	c.MinBackoff, c.MaxBackoff = o.MinBackoff, o.MaxBackoff
	c.KubeletKey = m.Key
	c.Purpose = attest.PurposeReattest
	// The agent's reattest mode is a process that exits when done (a
	// systemd oneshot on a timer), closing its connection: so does this
	// one, rather than leave it idle on the server until its IdleTimeout.
	defer c.HTTP.CloseIdleConnections()
	c.HTTP.Transport.(*http.Transport).DialContext = (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(m.Source)}, Timeout: 10 * time.Second,
	}).DialContext
	w.spreadClient(c.HTTP)
	ev := m.Evidence
	if te, ok := ev.(agent.TPMEvidence); ok {
		te.Ticket = m.ticket
		te.Keep = func(t string) error {
			if t != "" {
				m.ticket = t
			}
			return nil
		}
		ev = te
	}
	vr, err := ev.Attest(ctx, c, "worker", m.NodeName, m.Pub)
	if err != nil {
		return 0, fmt.Errorf("%s: re-attestation: %w", m.Name, err)
	}
	if vr.Reattest == nil {
		return 0, fmt.Errorf("%s: the server's answer is not a re-attestation's", m.Name)
	}
	return time.Since(start), nil
}
