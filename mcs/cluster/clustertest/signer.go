package clustertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

// Signer plays kube-controller-manager's CSR signing controller for the
// two kubelet signers (kubernetes.io/kube-apiserver-client-kubelet,
// kubernetes.io/kubelet-serving), which no process runs here: it issues a
// certificate for every approved CSR of theirs, for the CSR's public key
// and subject (and SANs, for serving), as status.certificate. Its CA is
// the API server's client CA (it is the control plane's envtest.Authn, so
// the admin's certificate comes from it too): a kubelet authenticates with
// what it issued, and the API server records that certificate's
// credential ID (X509SHA256=…) in the requests it makes, CSRs included.
type Signer struct {
	// Duration is the life of the certificates it issues when the CSR
	// asks for none (spec.expirationSeconds, which is honoured down to 10
	// minutes, as kube-controller-manager does). Default 24 h.
	Duration time.Duration

	ca    *x509.Certificate
	caPEM []byte
	key   *ecdsa.PrivateKey
	dir   string

	mu     sync.Mutex
	serial int64
	issued int
}

var _ envtest.Authn = (*Signer)(nil)

// NewSigner makes a signer with a new CA (ECDSA P-256).
func NewSigner() (*Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "clustertest kubelet signer and client CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Signer{ca: ca, key: key, serial: 1, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// CA is the signer's CA certificate (PEM): the API server's client CA.
func (s *Signer) CA() []byte { return s.caPEM }

// WriteCA writes the signer's CA certificate and key (PEM) into dir, as
// kube-controller-manager's --cluster-signing-cert-file and
// --cluster-signing-key-file read them: a real CSR signing controller
// then signs with the CA the API server trusts for client certificates,
// in Run's place.
func (s *Signer) WriteCA(dir string) (certFile, keyFile string, err error) {
	der, err := x509.MarshalECPrivateKey(s.key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "signer-ca.crt"), filepath.Join(dir, "signer-ca.key")
	if err := os.WriteFile(certFile, s.caPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// Issued is how many certificates Run has issued.
func (s *Signer) Issued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.issued
}

// Configure implements envtest.Authn: the API server's --client-ca-file
// is the signer's CA.
func (s *Signer) Configure(workDir string, args *envtest.Arguments) error {
	s.dir = workDir
	args.Set("client-ca-file", filepath.Join(workDir, "clustertest-client-ca.crt"))
	return nil
}

// Start implements envtest.Authn: it writes the CA file.
func (s *Signer) Start() error {
	if s.dir == "" {
		return errors.New("clustertest: signer started before it was configured")
	}
	return os.WriteFile(filepath.Join(s.dir, "clustertest-client-ca.crt"), s.caPEM, 0o600)
}

// Stop implements envtest.Authn.
func (s *Signer) Stop() error { return nil }

// AddUser implements envtest.Authn: a client certificate for the user
// (CN the name, O the groups), valid for a day.
func (s *Signer) AddUser(user envtest.User, base *rest.Config) (*rest.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := s.sign(&x509.Certificate{Subject: pkix.Name{CommonName: user.Name, Organization: user.Groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &key.PublicKey, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(base)
	cfg.CertData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	cfg.KeyData = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	return cfg, nil
}

func (s *Signer) sign(tmpl *x509.Certificate, pub any, life time.Duration) ([]byte, error) {
	s.mu.Lock()
	s.serial++
	tmpl.SerialNumber = big.NewInt(s.serial)
	s.mu.Unlock()
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-5*time.Minute), now.Add(life)
	tmpl.KeyUsage |= x509.KeyUsageDigitalSignature
	return x509.CreateCertificate(rand.Reader, tmpl, s.ca, pub, s.key)
}

// Sign issues the certificate for csr as the kubelet signers do: the
// CSR's subject and public key, its DNS and IP SANs for serving, client
// or server auth; the life spec.expirationSeconds asks (at least 10
// minutes) or Duration.
func (s *Signer) Sign(csr *certv1.CertificateSigningRequest) ([]byte, error) {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return nil, errors.New("clustertest: the CSR holds no PEM block")
	}
	cr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	if err := cr.CheckSignature(); err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{Subject: cr.Subject}
	switch csr.Spec.SignerName {
	case certv1.KubeAPIServerClientKubeletSignerName:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	case certv1.KubeletServingSignerName:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames, tmpl.IPAddresses = cr.DNSNames, cr.IPAddresses
	default:
		return nil, fmt.Errorf("clustertest: signer %s is not a kubelet signer", csr.Spec.SignerName)
	}
	life := s.Duration
	if life <= 0 {
		life = 24 * time.Hour
	}
	if e := csr.Spec.ExpirationSeconds; e != nil {
		life = min(life, max(10*time.Minute, time.Duration(*e)*time.Second))
	}
	der, err := s.sign(tmpl, cr.PublicKey, life)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// Run issues certificates for approved kubelet CSRs (Sign, then the CSR's
// status subresource) until ctx ends. kc needs sign on the two signers and
// update of certificatesigningrequests/status (the admin has them).
func (s *Signer) Run(ctx context.Context, kc kubernetes.Interface) error {
	factory := informers.NewSharedInformerFactory(kc, 0)
	inf := factory.Certificates().V1().CertificateSigningRequests().Informer()
	work := make(chan string, 1024)
	handle := func(obj any) {
		csr, ok := obj.(*certv1.CertificateSigningRequest)
		if ok && toSign(csr) {
			select {
			case work <- csr.Name:
			case <-ctx.Done():
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: handle, UpdateFunc: func(_, o any) { handle(o) }}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for {
		select {
		case <-ctx.Done():
			return nil
		case name := <-work:
			if err := s.issue(ctx, kc, name); err != nil && ctx.Err() == nil {
				// Retried at the next update, or now for a conflict.
				if !errors.Is(err, errSkip) {
					go func() {
						select {
						case <-time.After(100 * time.Millisecond):
							work <- name
						case <-ctx.Done():
						}
					}()
				}
			}
		}
	}
}

var errSkip = errors.New("nothing to sign")

func (s *Signer) issue(ctx context.Context, kc kubernetes.Interface, name string) error {
	csr, err := kc.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return errSkip // gone
	}
	if !toSign(csr) {
		return errSkip
	}
	cert, err := s.Sign(csr)
	if err != nil {
		return errSkip
	}
	csr.Status.Certificate = cert
	if _, err := kc.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		return err
	}
	s.mu.Lock()
	s.issued++
	s.mu.Unlock()
	return nil
}

// toSign reports whether csr is a kubelet CSR approved and not yet issued.
func toSign(csr *certv1.CertificateSigningRequest) bool {
	if len(csr.Status.Certificate) > 0 || (csr.Spec.SignerName != certv1.KubeAPIServerClientKubeletSignerName && csr.Spec.SignerName != certv1.KubeletServingSignerName) {
		return false
	}
	approved := false
	for _, c := range csr.Status.Conditions {
		switch {
		case c.Type == certv1.CertificateApproved && c.Status == corev1.ConditionTrue:
			approved = true
		case c.Type == certv1.CertificateDenied || c.Type == certv1.CertificateFailed:
			return false
		}
	}
	return approved
}

// StartSigning is Start with a Signer: the API server trusts its CA for
// client certificates, and it issues the certificates of approved kubelet
// CSRs until the test ends.
func StartSigning(t testing.TB, crdDirs ...string) (*rest.Config, *Signer) {
	t.Helper()
	s, err := NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	e, err := LaunchWith(t.TempDir(), LaunchOptions{CRDDirs: crdDirs, Signer: s})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clustertest: kube-apiserver %s at %s (bootstrap token auth, kubelet signer), started in %s",
		testenv.KubeVersion, e.Config.Host, e.Took.Round(time.Millisecond))
	kc, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, kc) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("clustertest: signer: %v", err)
		}
		if err := e.Stop(); err != nil {
			t.Errorf("clustertest: stopping envtest: %v", err)
		}
	})
	return e.Config, s
}

// KubeletConfig waits up to timeout for the certificate issued for the CSR
// name (a Signer issues it once the CSR is approved) and returns base's
// server (host and CA) with that certificate and keyPEM (PEM): what a
// kubelet with that certificate authenticates as.
func KubeletConfig(ctx context.Context, kc kubernetes.Interface, base *rest.Config, name string, keyPEM []byte, timeout time.Duration) (*rest.Config, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := kc.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if len(c.Status.Certificate) > 0 {
			return &rest.Config{Host: base.Host, TLSClientConfig: rest.TLSClientConfig{CAData: base.CAData, CertData: c.Status.Certificate, KeyData: keyPEM}}, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("clustertest: no certificate issued for CSR %s within %s", name, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// NodesMayRequest lets the group system:nodes create, read and watch
// CSRs, as a cluster's system:node role and Node authorizer do (this
// control plane runs RBAC only).
func NodesMayRequest(ctx context.Context, kc kubernetes.Interface) error {
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "clustertest-nodes-request-certificates"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
			Verbs: []string{"create", "get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "clustertest-nodes-request-certificates"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "clustertest-nodes-request-certificates"},
		Subjects:   []rbacv1.Subject{{Kind: "Group", APIGroup: rbacv1.GroupName, Name: "system:nodes"}},
	}, metav1.CreateOptions{})
	return err
}

// KeyPEM is key as PEM (EC PRIVATE KEY), for KubeletConfig.
func KeyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}
