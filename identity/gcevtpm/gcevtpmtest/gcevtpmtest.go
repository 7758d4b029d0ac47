// Package gcevtpmtest makes software TPMs look like a GCE Shielded VM's
// vTPM, for tests of identity/gcevtpm and of anything built on it: a
// stand-in for Google's Certificate Authority Service hierarchy ("EK/AK CA
// Root" and "EK/AK CA Intermediate", RSA-2048 and SHA-256 as Google's),
// which issues AK certificates with the layout of real ones (subject
// L=zone, O=Google Compute Engine, OU=project ID, CN=instance ID; critical
// digitalSignature key usage; critical CA:FALSE; an AIA URL; the instance
// extension 1.3.6.1.4.1.11129.2.1.21 with Google's security properties),
// and swtpm provisioned as GCE provisions a VM: the AK templates in NV at
// 0x01c10001 (RSA) and 0x01c10003 (ECC), the AK certificates at
// 0x01c10000 and 0x01c10002.
package gcevtpmtest

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"io"
	"math/big"
	"strconv"
	"time"

	"github.com/google/go-tpm-tools/client"

	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// CA is a stand-in for Google's EK/AK CA: a root and an intermediate.
type CA struct{ *tpmtest.LabCA }

func googleName(cn string) pkix.Name {
	return pkix.Name{
		Country: []string{"US"}, Province: []string{"California"}, Locality: []string{"Mountain View"},
		Organization: []string{"Google LLC"}, OrganizationalUnit: []string{"Google Cloud"}, CommonName: cn,
	}
}

// NewCA makes a root and an intermediate valid around now, with Google's
// names (so a test CA is told apart from Google's by its key alone).
func NewCA(now time.Time) (*CA, error) {
	ca, err := tpmtest.NewLabCA(&x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: googleName("EK/AK CA Root"),
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(100, 0, 0),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
	}, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: googleName("EK/AK CA Intermediate"),
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(90, 0, 0),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
		IssuingCertificateURL: []string{"http://privateca-content-00000000-0000-0000-0000-000000000000.storage.googleapis.com/000000000000/ca.crt"},
	})
	if err != nil {
		return nil, err
	}
	return &CA{ca}, nil
}

// Trust is this CA's root pinned and its intermediate shipped, as
// gcevtpm.DefaultTrust pins Google's.
func (ca *CA) Trust(now time.Time) (*gcevtpm.Trust, error) {
	return gcevtpm.NewTrust([]*x509.Certificate{ca.Root}, []*x509.Certificate{ca.Intermediate}, now)
}

// Instance is a test VM's identity, production unless said otherwise.
func Instance(name string) gcevtpm.InstanceInfo {
	return gcevtpm.InstanceInfo{
		Zone: "us-central1-a", ProjectNumber: 117478906985, ProjectID: "nodeproof-test",
		InstanceID: 218557372616137117, InstanceName: name, IsProduction: true,
	}
}

// MarshalInstanceInfo encodes i with the layout of Google's extension,
// including the four security-property booleans ([2]..[5]) Google's
// certificates carry after isProduction (true, false, false, false).
func MarshalInstanceInfo(i gcevtpm.InstanceInfo) ([]byte, error) {
	type props struct {
		SecurityVersion *big.Int `asn1:"explicit,tag:0"`
		IsProduction    bool     `asn1:"explicit,tag:1"`
		P2              bool     `asn1:"explicit,tag:2"`
		P3              bool     `asn1:"explicit,tag:3"`
		P4              bool     `asn1:"explicit,tag:4"`
		P5              bool     `asn1:"explicit,tag:5"`
	}
	type info struct {
		Zone          string `asn1:"utf8"`
		ProjectNumber *big.Int
		ProjectID     string `asn1:"utf8"`
		InstanceID    *big.Int
		InstanceName  string `asn1:"utf8"`
		Props         props  `asn1:"explicit,tag:0"`
	}
	return asn1.Marshal(info{
		Zone: i.Zone, ProjectNumber: new(big.Int).SetUint64(i.ProjectNumber), ProjectID: i.ProjectID,
		InstanceID: new(big.Int).SetUint64(i.InstanceID), InstanceName: i.InstanceName,
		Props: props{SecurityVersion: new(big.Int).SetUint64(i.SecurityVersion), IsProduction: i.IsProduction, P2: true},
	})
}

// Cert says how to issue an AK certificate; the zero value issues one as
// Google does.
type Cert struct {
	// NotBefore and NotAfter override the validity (default: an hour ago
	// to 30 years on, as Google's).
	NotBefore, NotAfter time.Time
	// NoExtension leaves the instance extension out; Extension, when set,
	// replaces its value.
	NoExtension bool
	Extension   []byte
	// KeyUsage overrides digitalSignature (an encryption key's
	// certificate has keyEncipherment).
	KeyUsage x509.KeyUsage
	// AIA overrides the Authority Information Access URL.
	AIA []string
}

// IssueAK issues an AK certificate for pub naming inst.
func (ca *CA) IssueAK(pub crypto.PublicKey, inst gcevtpm.InstanceInfo, now time.Time, c Cert) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Locality: []string{inst.Zone}, Organization: []string{"Google Compute Engine"},
			OrganizationalUnit: []string{inst.ProjectID}, CommonName: strconv.FormatUint(inst.InstanceID, 10),
		},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(30, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		IssuingCertificateURL: []string{"http://privateca-content-00000000-0000-0000-0000-000000000000.storage.googleapis.com/111111111111/ca.crt"},
	}
	if !c.NotBefore.IsZero() {
		tmpl.NotBefore = c.NotBefore
	}
	if !c.NotAfter.IsZero() {
		tmpl.NotAfter = c.NotAfter
	}
	if c.KeyUsage != 0 {
		tmpl.KeyUsage = c.KeyUsage
	}
	if c.AIA != nil {
		tmpl.IssuingCertificateURL = c.AIA
	}
	if !c.NoExtension {
		ext := c.Extension
		if ext == nil {
			if ext, err = MarshalInstanceInfo(inst); err != nil {
				return nil, err
			}
		}
		tmpl.ExtraExtensions = []pkix.Extension{{Id: gcevtpm.OIDInstanceInfo, Value: ext}}
	}
	return ca.Issue(tmpl, pub)
}

// Alg is an AK algorithm GCE provisions.
type Alg int

// The two AKs of a GCE vTPM.
const (
	RSA Alg = iota
	ECC
)

func (a Alg) indices() (cert, template uint32) {
	if a == ECC {
		return client.GceAKCertNVIndexECC, client.GceAKTemplateNVIndexECC
	}
	return client.GceAKCertNVIndexRSA, client.GceAKTemplateNVIndexRSA
}

// Provision makes the TPM behind rw look like a GCE vTPM for alg: the AK
// template in NV, the AK made from it under the endorsement hierarchy (as
// the VM will make it) and its certificate, issued by ca with c for inst,
// in NV (omitted when certify is false: a VM without an AK certificate).
// It returns the AK's public key and its certificate.
func (ca *CA) Provision(rw io.ReadWriter, alg Alg, inst gcevtpm.InstanceInfo, now time.Time, certify bool, c Cert) (crypto.PublicKey, []byte, error) {
	certIdx, tmplIdx := alg.indices()
	tmpl := client.AKTemplateRSA()
	if alg == ECC {
		tmpl = client.AKTemplateECC()
	}
	enc, err := tmpl.Encode()
	if err != nil {
		return nil, nil, err
	}
	if err := tpmtest.WriteNV(rw, tmplIdx, enc); err != nil {
		return nil, nil, fmt.Errorf("AK template: %w", err)
	}
	k, err := client.EndorsementKeyFromNvIndex(rw, tmplIdx)
	if err != nil {
		return nil, nil, fmt.Errorf("AK from template: %w", err)
	}
	pub := k.PublicKey()
	k.Close()
	if !certify {
		return pub, nil, nil
	}
	der, err := ca.IssueAK(pub, inst, now, c)
	if err != nil {
		return nil, nil, err
	}
	if err := tpmtest.WriteNV(rw, certIdx, der); err != nil {
		return nil, nil, fmt.Errorf("AK certificate: %w", err)
	}
	return pub, der, nil
}

// VM is a swtpm that looks like a GCE Shielded VM's vTPM, its PCRs
// holding a real firmware log.
type VM struct {
	TPM *swtpm.TPM
	Log []byte
	// AKs are the AK public keys provisioned, by algorithm.
	AKs map[Alg]crypto.PublicKey
}

// VMOptions say how to provision a VM.
type VMOptions struct {
	// Algs are the AKs to provision (default both).
	Algs []Alg
	// NoCertificate provisions the templates without certificates.
	NoCertificate bool
	// Cert says how the certificates are issued.
	Cert Cert
}

// NewVM provisions a swtpm in dir with man's EK certificates (a GCE vTPM
// has EK certificates too), starts it, boots it with log and provisions
// the GCE AKs for inst.
func (ca *CA) NewVM(ctx context.Context, man *swtpm.Manufacturer, dir string, log []byte, inst gcevtpm.InstanceInfo, now time.Time, o VMOptions) (*VM, error) {
	p, ch, err := man.Boot(ctx, dir, log)
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	vm := &VM{TPM: p, Log: log, AKs: map[Alg]crypto.PublicKey{}}
	algs := o.Algs
	if algs == nil {
		algs = []Alg{RSA, ECC}
	}
	for _, a := range algs {
		pub, _, err := ca.Provision(ch, a, inst, now, !o.NoCertificate, o.Cert)
		if err != nil {
			p.Stop()
			return nil, err
		}
		vm.AKs[a] = pub
	}
	return vm, nil
}

// Dial opens a command channel to the VM's TPM that reports the VM's log.
func (vm *VM) Dial() (*tpm.SocketChannel, error) {
	return tpm.DialSocket("tcp", vm.TPM.Addr, vm.Log)
}

// Close stops the TPM.
func (vm *VM) Close() { vm.TPM.Stop() }
