// Package azuretpmtest makes software TPMs look like an Azure Trusted
// Launch VM's vTPM and serves a fake Instance Metadata Service, for tests
// of identity/azuretpm and of anything built on it.
//
// Two lab hierarchies stand in for Microsoft's, with their names (so a
// lab certificate is told apart from Azure's by its key alone): a vTPM CA
// ("Azure Virtual TPM Root Certificate Authority 2023" → "Global Virtual
// TPM CA - 03") that issues AK certificates with Azure's subject
// (CN=<vm id>.TrustedVM.Azure.windows.net), and an IMDS CA ("DigiCert
// Global Root G2" → "Microsoft Azure RSA TLS Issuing CA 03" →
// metadata.azure.com) that signs attested documents as IMDS does: PKCS#7
// SignedData, SHA-256, content attached, the signer's certificate alone
// embedded. The verifier under test is given the lab roots (Trust)
// instead of the pinned ones.
//
// A VM is swtpm provisioned as Azure provisions a Trusted Launch vTPM: an
// RSA AK persisted at 0x81000003 and its certificate in NV 0x01C101D0.
// (swtpm also holds EK certificates, which Azure's vTPM lacks; nothing
// here reads them.)
package azuretpmtest

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/smallstep/pkcs7"

	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// Test identities.
const (
	VMID           = "5f3c8a1e-2b7d-4c9a-9e61-0d8b4a7f2c13"
	SubscriptionID = "8d2e6c4b-1a3f-4e5d-b7c9-2f0a1e3d5b6c"
)

// hierarchy is a root and an intermediate under it, RSA-2048: a
// tpmtest.LabCA with Azure's shape (the root for 25 years, the
// intermediate for 2, at path length zero).
func newHierarchy(root, inter pkix.Name, now time.Time) (*tpmtest.LabCA, error) {
	return tpmtest.NewLabCA(&x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: root, NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(25, 0, 0),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: inter, NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(2, 0, 0),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	})
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
}

// CA is a stand-in for Azure's vTPM hierarchy.
type CA struct{ *tpmtest.LabCA }

// NewCA makes a root and an intermediate valid around now, with Azure's
// names.
func NewCA(now time.Time) (*CA, error) {
	h, err := newHierarchy(
		pkix.Name{Country: []string{"US"}, Organization: []string{"Microsoft Corporation"}, CommonName: "Azure Virtual TPM Root Certificate Authority 2023"},
		pkix.Name{CommonName: "Global Virtual TPM CA - 03"}, now)
	if err != nil {
		return nil, err
	}
	return &CA{h}, nil
}

// Cert says how to issue an AK certificate; the zero value issues one as
// Azure does.
type Cert struct {
	// NotBefore and NotAfter override the validity (default: an hour ago
	// to a year on).
	NotBefore, NotAfter time.Time
	// CommonName overrides <vm id>.TrustedVM.Azure.windows.net.
	CommonName string
	// KeyUsage overrides digitalSignature.
	KeyUsage x509.KeyUsage
}

// IssueAK issues an AK certificate for pub naming vmID.
func (ca *CA) IssueAK(pub crypto.PublicKey, vmID string, now time.Time, c Cert) ([]byte, error) {
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: vmID + ".TrustedVM.Azure.windows.net"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
	}
	if !c.NotBefore.IsZero() {
		tmpl.NotBefore = c.NotBefore
	}
	if !c.NotAfter.IsZero() {
		tmpl.NotAfter = c.NotAfter
	}
	if c.CommonName != "" {
		tmpl.Subject.CommonName = c.CommonName
	}
	if c.KeyUsage != 0 {
		tmpl.KeyUsage = c.KeyUsage
	}
	return ca.Issue(tmpl, pub)
}

// IMDSCA is a stand-in for the TLS hierarchy IMDS's signer is under, with
// the signer's certificate.
type IMDSCA struct {
	*tpmtest.LabCA
	Signer    *x509.Certificate
	signerKey *rsa.PrivateKey
}

// NewIMDSCA makes the hierarchy and a signer certificate for name
// (metadata.azure.com as IMDS's; another name for an attack), valid
// around now.
func NewIMDSCA(now time.Time, name string) (*IMDSCA, error) {
	h, err := newHierarchy(
		pkix.Name{Country: []string{"US"}, Organization: []string{"DigiCert Inc"}, OrganizationalUnit: []string{"www.digicert.com"}, CommonName: "DigiCert Global Root G2"},
		pkix.Name{Country: []string{"US"}, Organization: []string{"Microsoft Corporation"}, CommonName: "Microsoft Azure RSA TLS Issuing CA 03"}, now)
	if err != nil {
		return nil, err
	}
	ca := &IMDSCA{LabCA: h}
	if ca.Signer, ca.signerKey, err = ca.IssueSigner(name, now.Add(-time.Hour), now.AddDate(0, 6, 0)); err != nil {
		return nil, err
	}
	return ca, nil
}

// IssueSigner issues a TLS server certificate for name, valid from
// notBefore to notAfter, as the IMDS signer's.
func (ca *IMDSCA) IssueSigner(name string, notBefore, notAfter time.Time) (*x509.Certificate, *rsa.PrivateKey, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{Country: []string{"US"}, Province: []string{"WA"}, Locality: []string{"Redmond"}, Organization: []string{"Microsoft Corporation"}, CommonName: name},
		DNSNames: []string{name}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := ca.Issue(tmpl, key.Public())
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// Content is an attested document's content.
type Content struct {
	Nonce, VMID, SubscriptionID, SKU string
	Created, Expires                 time.Time
}

// NewContent is the content IMDS signs for nonce at now: this package's
// VM and subscription, valid for six hours.
func NewContent(nonce string, now time.Time) Content {
	return Content{Nonce: nonce, VMID: VMID, SubscriptionID: SubscriptionID, SKU: "22_04-lts-gen2", Created: now, Expires: now.Add(6 * time.Hour)}
}

// JSON is the content as IMDS writes it.
func (c Content) JSON() []byte {
	type plan struct {
		Name      string `json:"name"`
		Product   string `json:"product"`
		Publisher string `json:"publisher"`
	}
	b, _ := json.Marshal(struct {
		LicenseType    string            `json:"licenseType"`
		Nonce          string            `json:"nonce"`
		Plan           plan              `json:"plan"`
		SKU            string            `json:"sku"`
		SubscriptionID string            `json:"subscriptionId"`
		TimeStamp      map[string]string `json:"timeStamp"`
		VMID           string            `json:"vmId"`
	}{
		Nonce: c.Nonce, SKU: c.SKU, SubscriptionID: c.SubscriptionID, VMID: c.VMID,
		TimeStamp: map[string]string{"createdOn": c.Created.UTC().Format(azuretpm.TimestampLayout), "expiresOn": c.Expires.UTC().Format(azuretpm.TimestampLayout)},
	})
	return b
}

// Sign signs content with ca's signer as IMDS does and returns the
// "signature" field: base64 of the DER PKCS#7.
func (ca *IMDSCA) Sign(content []byte) (string, error) {
	return SignWith(content, ca.Signer, ca.signerKey)
}

// SignWith signs content as IMDS does with cert and key.
func SignWith(content []byte, cert *x509.Certificate, key crypto.Signer) (string, error) {
	sd, err := pkcs7.NewSignedData(content)
	if err != nil {
		return "", err
	}
	sd.SetDigestAlgorithm(pkcs7.OIDDigestAlgorithmSHA256)
	if err := sd.AddSigner(cert, key, pkcs7.SignerInfoConfig{}); err != nil {
		return "", err
	}
	der, err := sd.Finish()
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(der), nil
}

// Trust is the lab roots pinned and the lab intermediates shipped, as
// azuretpm.DefaultTrust pins Microsoft's.
func Trust(ca *CA, imds *IMDSCA, now time.Time) (*azuretpm.Trust, error) {
	return azuretpm.NewTrust(azuretpm.TrustSet{
		AKRoots: []*x509.Certificate{ca.Root}, AKIntermediates: []*x509.Certificate{ca.Intermediate},
		DocumentRoots: []*x509.Certificate{imds.Root}, DocumentIntermediates: []*x509.Certificate{imds.Intermediate},
	}, now)
}

// IMDS is a fake Instance Metadata Service speaking the attested document
// protocol: GET /metadata/attested/document with "Metadata: true", an
// api-version and a nonce of 1-32 alphanumerics; anything else is refused
// with 400 as IMDS refuses it. It signs Content for its VM.
type IMDS struct {
	*httptest.Server
	ca    *IMDSCA
	clock func() time.Time

	mu       sync.Mutex
	content  func(Content) Content
	requests int
}

var nonceRE = regexp.MustCompile(`^[A-Za-z0-9]{1,32}$`)

// NewIMDS starts a fake IMDS signing with ca at clock's time.
func NewIMDS(ca *IMDSCA, clock func() time.Time) *IMDS {
	m := &IMDS{ca: ca, clock: clock}
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	return m
}

// Client is the azuretpm IMDS client for this server.
func (m *IMDS) Client() *azuretpm.IMDS {
	return &azuretpm.IMDS{Endpoint: m.URL, Timeout: 5 * time.Second}
}

// Requests is the number of attested documents served.
func (m *IMDS) Requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests
}

// Rewrite makes the server change each content before signing it (nil:
// sign it as it is).
func (m *IMDS) Rewrite(f func(Content) Content) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.content = f
}

func (m *IMDS) serve(rw http.ResponseWriter, r *http.Request) {
	fail := func(code int, msg string) {
		rw.Header().Set("Content-Type", "application/json; charset=utf-8")
		rw.WriteHeader(code)
		fmt.Fprintf(rw, `{"error":"Bad request","error_description":%q}`, msg)
	}
	if r.URL.Path != "/metadata/attested/document" {
		fail(http.StatusNotFound, "not found")
		return
	}
	if r.Method != http.MethodGet {
		fail(http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	if r.Header.Get("Metadata") != "true" {
		fail(http.StatusBadRequest, "Required metadata header not specified")
		return
	}
	if r.Header.Get("X-Forwarded-For") != "" {
		fail(http.StatusBadRequest, "proxied request")
		return
	}
	q := r.URL.Query()
	if q.Get("api-version") == "" {
		fail(http.StatusBadRequest, "Bad request. api-version was not specified in the request")
		return
	}
	nonce := q.Get("nonce")
	if !nonceRE.MatchString(nonce) {
		fail(http.StatusBadRequest, "Bad request. nonce must be at most 32 alphanumeric characters")
		return
	}
	m.mu.Lock()
	c := NewContent(nonce, m.clock())
	if m.content != nil {
		c = m.content(c)
	}
	m.requests++
	m.mu.Unlock()
	sig, err := m.ca.Sign(c.JSON())
	if err != nil {
		fail(http.StatusInternalServerError, err.Error())
		return
	}
	rw.Header().Set("Content-Type", "application/json; charset=utf-8")
	json.NewEncoder(rw).Encode(map[string]string{"encoding": "pkcs7", "signature": sig})
}

// VM is a swtpm that looks like an Azure Trusted Launch VM's vTPM, its
// PCRs holding a real firmware log.
type VM struct {
	TPM *swtpm.TPM
	Log []byte
	// AK is the AK's public key (nil when VMOptions.NoAK).
	AK crypto.PublicKey
}

// VMOptions say how to provision a VM.
type VMOptions struct {
	// NoAK leaves 0x81000003 empty; NoCertificate leaves NV 0x01C101D0
	// undefined.
	NoAK, NoCertificate bool
	// Cert says how the certificate is issued.
	Cert Cert
}

// NewVM provisions a swtpm in dir, starts it, boots it with log and
// provisions the AK and its certificate naming vmID.
func (ca *CA) NewVM(ctx context.Context, man *swtpm.Manufacturer, dir string, log []byte, vmID string, now time.Time, o VMOptions) (*VM, error) {
	p, ch, err := man.Boot(ctx, dir, log)
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	vm := &VM{TPM: p, Log: log}
	if err := ca.Provision(ch, vmID, now, o, vm); err != nil {
		p.Stop()
		return nil, err
	}
	return vm, nil
}

// Provision makes the TPM behind rw an Azure vTPM: an RSA AK (go-tpm-tools'
// AK template: restricted, RSASSA-SHA256) persisted at 0x81000003 and its
// certificate, issued by ca for vmID with o.Cert, in NV 0x01C101D0.
func (ca *CA) Provision(rw io.ReadWriter, vmID string, now time.Time, o VMOptions, vm *VM) error {
	pub := crypto.PublicKey(nil)
	if !o.NoAK {
		k, err := client.NewCachedKey(rw, tpm2.HandleOwner, client.AKTemplateRSA(), tpmutil.Handle(azuretpm.AKHandle))
		if err != nil {
			return fmt.Errorf("AK: %w", err)
		}
		pub = k.PublicKey()
		vm.AK = pub
	}
	if o.NoCertificate {
		return nil
	}
	if pub == nil {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return err
		}
		pub = k.Public()
	}
	der, err := ca.IssueAK(pub, vmID, now, o.Cert)
	if err != nil {
		return err
	}
	return tpmtest.WriteNV(rw, azuretpm.AKCertNVIndex, der)
}

// Dial opens a command channel to the VM's TPM that reports the VM's log.
func (vm *VM) Dial() (*tpm.SocketChannel, error) {
	return tpm.DialSocket("tcp", vm.TPM.Addr, vm.Log)
}

// Close stops the TPM.
func (vm *VM) Close() { vm.TPM.Stop() }
