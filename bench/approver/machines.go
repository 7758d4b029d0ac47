package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

var kubeletUsages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}

// machine is one attested node and its kubelet.
type machine struct {
	node    string
	key     *ecdsa.PrivateKey
	csrPEM  []byte
	csrName string
	rec     *store.Record
	kc      kubernetes.Interface // the kubelet's client: its bootstrap token, its own connection

	// Filled in by the timed phase.
	name      string
	uid       types.UID
	submitted time.Time // before the CSR create
	seen      time.Time // the kubelet's watch saw it approved
	err       error
}

// fleet makes machines: what nodeproof's server writes when a machine
// attests (a bootstrap token, a NodeAttestation record with its session
// marker) and the kubelet's bootstrap config.
type fleet struct {
	server      *kubestore.Store // the MCS's store (unthrottled client)
	tokens      *cluster.Tokens  // nil: one shared bootstrap token (-tokens=false)
	sharedToken *rest.Config
}

// prepare makes n machines named prefix-NNNN, concurrently, and waits until
// every kubelet's token authenticates (the API server's bootstrap token
// authenticator reads Secrets through an informer).
func (f *fleet) prepare(ctx context.Context, prefix string, n int) ([]*machine, error) {
	ms := make([]*machine, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ms[i], errs[i] = f.machine(ctx, fmt.Sprintf("%s-%04d", prefix, i))
		}()
	}
	wg.Wait()
	return ms, errors.Join(errs...)
}

func (f *fleet) machine(ctx context.Context, node string) (*machine, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(der)
	now := time.Now()
	rec := &store.Record{ID: randomHex(12), NodeName: node, Pool: "worker", Kind: attest.KindTPM,
		Identity: "bench EK " + node, KubeletKeySHA256: sum[:], Summary: "benchmark record (no evidence checked)",
		CreatedAt: now, Expires: now.Add(time.Hour)}
	m := &machine{node: node, key: key, rec: rec}
	subject := &pkix.Name{Organization: []string{approver.NodesGroup}, CommonName: approver.NodeUserPrefix + node}
	if m.csrPEM, err = cert.MakeCSR(key, subject, nil, nil); err != nil {
		return nil, err
	}
	m.csrName = digestedName(der, subject, kubeletUsages)

	// What the server does after an attestation verified: the node's
	// bootstrap token, then the enrolment (the record with the session
	// marker, and the node name's binding), then the kubeconfig served in
	// the node's config.
	var cfg *rest.Config
	if f.tokens != nil {
		if err := f.tokens.Issue(ctx, rec); err != nil {
			return nil, err
		}
		if err := f.tokens.Activate(ctx, rec); err != nil { // as the config's delivery does
			return nil, err
		}
	}
	session := store.Once{Key: "session/" + randomHex(32), Expires: now.Add(10 * time.Minute)}
	if err := f.server.Enrol(ctx, rec, store.EnrolOptions{}, session); err != nil {
		return nil, err
	}
	if f.tokens != nil {
		kubeconfig, err := f.tokens.Kubeconfig(ctx, rec)
		if err != nil {
			return nil, err
		}
		if cfg, err = clientcmd.RESTConfigFromKubeConfig(kubeconfig); err != nil {
			return nil, err
		}
	} else {
		cfg = rest.CopyConfig(f.sharedToken)
	}
	if _, err := clustertest.WaitWhoAmI(ctx, cfg, 30*time.Second); err != nil {
		return nil, fmt.Errorf("%s: bootstrap token does not authenticate: %w", node, err)
	}
	// A kubelet is its own machine: its own TCP and TLS connection (a
	// custom dialer keeps client-go from sharing one cached transport
	// between configs with the same CA).
	cfg = rest.CopyConfig(cfg)
	cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	if m.kc, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return m, nil
}

// run submits every machine's CSR at once, as the kubelet's bootstrap does
// (client-go's csr.RequestCertificate, the node-csr-<digest> name), and
// waits, each on its own watch, as the kubelet's csr.WaitForCertificate
// does, until it is approved. It returns when every kubelet saw its CSR
// approved, denied, or failed, or ctx ends.
func run(ctx context.Context, ms []*machine) (start time.Time) {
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			m.submitted = time.Now()
			m.name, m.uid, m.err = csr.RequestCertificateWithContext(ctx, m.kc, m.csrPEM, m.csrName,
				approver.SignerKubeletClient, nil, kubeletUsages, m.key)
			if m.err != nil {
				return
			}
			if m.err = waitApproved(ctx, m.kc, m.name, m.uid); m.err == nil {
				m.seen = time.Now()
			}
		}()
	}
	start = time.Now()
	close(gate)
	wg.Wait()
	return start
}

// waitApproved is client-go's csr.WaitForCertificate (a list to probe the
// v1 API, then a list+watch on the CSR's name), waiting for the Approved
// condition instead of an issued certificate: no signer runs here.
func waitApproved(ctx context.Context, kc kubernetes.Interface, name string, uid types.UID) error {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	csrs := kc.CertificatesV1().CertificateSigningRequests()
	if _, err := csrs.List(ctx, metav1.ListOptions{FieldSelector: sel}); err != nil {
		return err
	}
	lw := &toolscache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return csrs.List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return csrs.Watch(ctx, o)
		},
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &certv1.CertificateSigningRequest{}, nil, func(ev watch.Event) (bool, error) {
		switch ev.Type {
		case watch.Added, watch.Modified:
		case watch.Deleted:
			return false, fmt.Errorf("csr %s was deleted", name)
		default:
			return false, nil
		}
		c := ev.Object.(*certv1.CertificateSigningRequest)
		if c.UID != uid {
			return false, fmt.Errorf("csr %s changed UIDs", name)
		}
		for _, cond := range c.Status.Conditions {
			switch cond.Type {
			case certv1.CertificateDenied, certv1.CertificateFailed:
				return false, fmt.Errorf("csr %s %s: %s: %s", name, cond.Type, cond.Reason, cond.Message)
			case certv1.CertificateApproved:
				return true, nil
			}
		}
		return false, nil
	})
	return err
}

// digestedName is the kubelet's CSR name (pkg/kubelet/certificate/bootstrap):
// node-csr- and a hash of the key, subject and usages, so a restarted
// kubelet finds its own CSR again.
func digestedName(publicKeyDER []byte, subject *pkix.Name, usages []certv1.KeyUsage) string {
	hash := sha512.New512_256()
	encode := base64.RawURLEncoding.EncodeToString
	write := func(data []byte) {
		hash.Write([]byte(encode(data)))
		hash.Write([]byte{'|'})
	}
	write(publicKeyDER)
	write([]byte(subject.CommonName))
	for _, o := range subject.Organization {
		write([]byte(o))
	}
	for _, u := range usages {
		write([]byte(u))
	}
	return "node-csr-" + encode(hash.Sum(nil))
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// observer timestamps, from one admin watch in the bench process, when each
// CSR first appeared and when it first appeared approved: the approval
// latency as the API server's watch stream shows it, to the millisecond
// (a CSR's creationTimestamp and a condition's lastUpdateTime are whole
// seconds).
type observer struct {
	mu       sync.Mutex
	added    map[string]time.Time
	approved map[string]time.Time
}

func newObserver(ctx context.Context, admin kubernetes.Interface) (*observer, error) {
	o := &observer{added: map[string]time.Time{}, approved: map[string]time.Time{}}
	lw := toolscache.NewListWatchFromClient(admin.CertificatesV1().RESTClient(), "certificatesigningrequests", "", fields.Everything())
	inf := toolscache.NewSharedIndexInformer(lw, &certv1.CertificateSigningRequest{}, 0, toolscache.Indexers{})
	see := func(obj any) {
		c, ok := obj.(*certv1.CertificateSigningRequest)
		if !ok {
			return
		}
		now := time.Now()
		o.mu.Lock()
		defer o.mu.Unlock()
		if _, ok := o.added[c.Name]; !ok {
			o.added[c.Name] = now
		}
		if _, ok := o.approved[c.Name]; !ok && approvedCond(c) != nil {
			o.approved[c.Name] = now
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: see, UpdateFunc: func(_, obj any) { see(obj) },
	}); err != nil {
		return nil, err
	}
	go inf.Run(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, errors.New("CSR observer did not sync")
	}
	return o, nil
}

func (o *observer) latency(name string) (time.Duration, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	a, ok1 := o.added[name]
	b, ok2 := o.approved[name]
	return b.Sub(a), ok1 && ok2
}

func approvedCond(c *certv1.CertificateSigningRequest) *certv1.CertificateSigningRequestCondition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == certv1.CertificateApproved {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}
