package tpm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	goattest "github.com/google/go-attestation/attest"
	"gopkg.in/yaml.v3"

	"github.com/nodeproof/nodeproof/attest"
)

// oidSubjectAltName is the SAN extension. TPM vendors mark it critical and
// fill it with TPM manufacturer fields (a directoryName) that Go's x509
// does not understand; the TCG EK credential profile requires it, so its
// presence is not a reason to refuse the certificate.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// RootSet is a named set of TPM-vendor certificate authorities. An EK
// certificate that chains to one of Roots (through Intermediates or through
// intermediates the node presents) is trusted as "ca:<Name>".
type RootSet struct {
	Name          string
	Roots         []*x509.Certificate
	Intermediates []*x509.Certificate
}

// LoadRootSet reads every PEM certificate in dir. Self-signed certificates
// become roots, the others intermediates. A directory with no root is an
// error: it would trust nothing, and saying so early beats a refusal later.
//
// Unlike the other bundles nodeproof reads (pemcert, which refuses
// anything but whole certificates), an EK root directory is read
// leniently: it holds what TPM vendors publish, copied as it comes — PEM
// files that also carry CRLs or other blocks, notes, text around the
// blocks — and each file is read up to its first non-PEM data, skipping
// blocks that are not certificates. Leniency here can only trust less:
// nothing but a certificate that parses is ever added, a file cut short
// loses its last roots (machines whose EKs chain there are refused
// EKUntrusted, which names the trust), and a certificate that does not
// parse is an error.
func LoadRootSet(name, dir string) (RootSet, error) {
	set := RootSet{Name: name}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return set, fmt.Errorf("read EK root directory: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return set, fmt.Errorf("read EK root: %w", err)
		}
		for len(data) > 0 {
			var block *pem.Block
			block, data = pem.Decode(data)
			if block == nil {
				break
			}
			if block.Type != "CERTIFICATE" {
				continue
			}
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return set, fmt.Errorf("parse EK root %s: %w", e.Name(), err)
			}
			if bytes.Equal(cert.RawIssuer, cert.RawSubject) && cert.CheckSignatureFrom(cert) == nil {
				set.Roots = append(set.Roots, cert)
			} else {
				set.Intermediates = append(set.Intermediates, cert)
			}
		}
	}
	if len(set.Roots) == 0 {
		return set, fmt.Errorf("EK root directory %s holds no self-signed root certificate", dir)
	}
	return set, nil
}

// InventoryEntry is one known TPM: the SHA-256 of its EK public key (PKIX
// DER, hex) and the node it belongs to.
type InventoryEntry struct {
	EKSHA256  string   `yaml:"ekSHA256" json:"ekSHA256"`
	NodeName  string   `yaml:"nodeName,omitempty" json:"nodeName,omitempty"`
	Addresses []string `yaml:"addresses,omitempty" json:"addresses,omitempty"`
}

// Inventory maps EK public key hashes to machines, for TPMs that carry no
// EK certificate (or fleets that prefer an explicit list).
type Inventory struct {
	byHash map[[32]byte]InventoryEntry
}

// NewInventory indexes entries; a malformed or repeated hash is an error.
func NewInventory(entries []InventoryEntry) (*Inventory, error) {
	inv := &Inventory{byHash: make(map[[32]byte]InventoryEntry, len(entries))}
	for i, e := range entries {
		raw, err := hex.DecodeString(strings.TrimSpace(e.EKSHA256))
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("inventory entry %d: ekSHA256 must be 64 hex digits", i)
		}
		if e.NodeName != "" && !attest.ValidNodeName(e.NodeName) {
			return nil, fmt.Errorf("inventory entry %d: nodeName %q is not a node name Kubernetes allows (a DNS-1123 subdomain: lower-case letters, digits, '-' and '.')", i, e.NodeName)
		}
		var k [32]byte
		copy(k[:], raw)
		if _, dup := inv.byHash[k]; dup {
			return nil, fmt.Errorf("inventory entry %d: EK %s listed twice", i, e.EKSHA256)
		}
		e.EKSHA256 = hex.EncodeToString(raw)
		inv.byHash[k] = e
	}
	return inv, nil
}

// LoadInventory reads a YAML inventory: {entries: [{ekSHA256, nodeName,
// addresses}]}. Unknown fields are an error.
func LoadInventory(path string) (*Inventory, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open EK inventory: %w", err)
	}
	defer f.Close()
	var doc struct {
		Entries []InventoryEntry `yaml:"entries"`
	}
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("decode EK inventory %s: %w", path, err)
	}
	// One document: entries after a `---` would be read by nothing.
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decode EK inventory %s: more than one YAML document (an inventory is one)", path)
	}
	return NewInventory(doc.Entries)
}

// Lookup returns the entry for an EK hash.
func (inv *Inventory) Lookup(ekSHA256 [32]byte) (InventoryEntry, bool) {
	if inv == nil {
		return InventoryEntry{}, false
	}
	e, ok := inv.byHash[ekSHA256]
	return e, ok
}

// ekFacts is what the EK check establishes.
type ekFacts struct {
	Public crypto.PublicKey
	SHA256 [32]byte
	Kind   string // attest.EKKinds

	Trust      string
	CertSubj   string
	CertIssuer string
	CertSerial string
	NodeName   string
	Addresses  []string
}

// ekTrust checks an EK. It is built once from Options and is safe for
// concurrent use.
//
// Checks, in order:
//  1. The EK public key parses as PKIX DER and is RSA (>= 2048 bits) or
//     ECDSA (P-256 or stronger).
//  2. If the EK's SHA-256 is in the inventory, it is trusted as
//     "inventory" (and the inventory names the node).
//  3. Otherwise an EK certificate is required; it is parsed with
//     go-attestation's tolerant parser (NV header, trailing bytes), it
//     must be an end-entity certificate (not a CA, no certificate-signing
//     key usage: a vendor's root or intermediate is not an EK), and its
//     public key must equal the EK public key byte for byte.
//  4. The certificate must chain, at the verifier's clock, to the roots of
//     one configured RootSet, through that set's intermediates or the
//     intermediates the node sent, each of which must parse
//     (EKCertificateInvalid) whether or not the chain needs it. The TCG-mandated critical SAN is the
//     only unhandled critical extension tolerated; any extended key usage
//     is accepted, as vendors differ.
//
// Verified intermediates are remembered (by their DER) so that later EKs
// from the same vendor cost one signature check, not a chain build.
type ekTrust struct {
	sets      []RootSet
	inventory *Inventory

	mu       sync.RWMutex
	verified map[[32]byte]verifiedIssuer // issuer cert DER hash -> chain facts
}

type verifiedIssuer struct {
	cert     *x509.Certificate
	set      string
	notAfter time.Time // earliest expiry along the issuer's chain
}

func newEKTrust(sets []RootSet, inv *Inventory) *ekTrust {
	t := &ekTrust{sets: sets, inventory: inv, verified: map[[32]byte]verifiedIssuer{}}
	// A root vouches for itself: certificates issued directly by a root
	// need only their own signature checked.
	for _, s := range sets {
		for _, r := range s.Roots {
			t.verified[sha256.Sum256(r.Raw)] = verifiedIssuer{cert: r, set: s.Name, notAfter: r.NotAfter}
		}
	}
	return t
}

func checkEKPublicStrength(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("RSA EK of %d bits", k.N.BitLen())
		}
	case *ecdsa.PublicKey:
		if k.Curve.Params().BitSize < 256 {
			return fmt.Errorf("ECC EK on %s", k.Curve.Params().Name)
		}
	default:
		return fmt.Errorf("EK key type %T", pub)
	}
	return nil
}

// EKKindOf names an EK's kind (attest.EKKinds) by its algorithm and size;
// "" for a key of no kind nodeproof knows.
func EKKindOf(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		switch k.N.BitLen() {
		case 2048:
			return attest.EKKindRSA2048
		case 3072:
			return attest.EKKindRSA3072
		case 4096:
			return attest.EKKindRSA4096
		}
	case *ecdsa.PublicKey:
		switch k.Curve.Params().Name {
		case "P-256":
			return attest.EKKindECCP256
		case "P-384":
			return attest.EKKindECCP384
		case "P-521":
			return attest.EKKindECCP521
		}
	}
	return ""
}

// check establishes trust in an EK; see the type's doc comment.
func (t *ekTrust) check(ekPublicDER, ekCertDER []byte, intermediatesDER [][]byte, now time.Time) (*ekFacts, error) {
	pub, err := x509.ParsePKIXPublicKey(ekPublicDER)
	if err != nil {
		return nil, attest.Deny(attest.ReasonMalformed, "tpm.ekPublic is not a PKIX DER public key")
	}
	if err := checkEKPublicStrength(pub); err != nil {
		return nil, attest.Deny(attest.ReasonMalformed, "tpm.ekPublic is too weak (%v)", err)
	}
	f := &ekFacts{Public: pub, SHA256: sha256.Sum256(ekPublicDER), Kind: EKKindOf(pub)}

	if e, ok := t.inventory.Lookup(f.SHA256); ok {
		f.Trust, f.NodeName, f.Addresses = "inventory", e.NodeName, e.Addresses
		return f, nil
	}
	if len(ekCertDER) == 0 {
		return nil, attest.DenySetting(attest.ReasonEKNotInInventory, "trust.ekInventory", "EK %x has no certificate and is not in the policy's trust.ekInventory (list its ekSHA256 there)", f.SHA256[:8])
	}
	cert, err := goattest.ParseEKCertificate(ekCertDER)
	if err != nil {
		return nil, attest.Deny(attest.ReasonEKCertInvalid, "tpm.ekCertificate does not parse as an X.509 certificate")
	}
	if cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign != 0 {
		return nil, attest.Deny(attest.ReasonEKCertInvalid, "EK certificate %q is a CA certificate", cert.Subject)
	}
	certPub, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
	if err != nil || !attest.Equal(certPub, ekPublicDER) {
		return nil, attest.Deny(attest.ReasonEKMismatch, "EK certificate key differs from the EK the TPM used")
	}
	f.CertSubj, f.CertIssuer = cert.Subject.String(), cert.Issuer.String()
	f.CertSerial = cert.SerialNumber.Text(16)
	set, err := t.chain(cert, intermediatesDER, now)
	if err != nil {
		return nil, err
	}
	f.Trust = "ca:" + set
	return f, nil
}

// chain verifies cert up to a configured root and returns the set's name.
func (t *ekTrust) chain(cert *x509.Certificate, intermediatesDER [][]byte, now time.Time) (string, error) {
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return "", attest.Deny(attest.ReasonEKUntrusted, "EK certificate is outside its validity period")
	}
	if err := checkCriticalExtensions(cert); err != nil {
		return "", err
	}
	// The node's intermediates must parse whichever path decides, so that
	// the outcome never depends on what the cache holds.
	extra := make([]*x509.Certificate, 0, len(intermediatesDER))
	for _, der := range intermediatesDER {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return "", attest.Deny(attest.ReasonEKCertInvalid, "a tpm.ekIntermediates certificate does not parse as X.509")
		}
		extra = append(extra, c)
	}
	// Fast path: the issuer is a root or an intermediate already verified.
	t.mu.RLock()
	var hit *verifiedIssuer
	for k, v := range t.verified {
		if bytes.Equal(v.cert.RawSubject, cert.RawIssuer) && now.Before(v.notAfter) {
			if cert.CheckSignatureFrom(v.cert) == nil {
				vv := t.verified[k]
				hit = &vv
				break
			}
		}
	}
	t.mu.RUnlock()
	if hit != nil {
		return hit.set, nil
	}

	// Slow path: a full chain build, then remember the verified issuers.
	var lastErr error
	for _, s := range t.sets {
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		for _, r := range s.Roots {
			roots.AddCert(r)
		}
		for _, c := range s.Intermediates {
			inter.AddCert(c)
		}
		for _, c := range extra {
			inter.AddCert(c)
		}
		leaf := *cert
		leaf.UnhandledCriticalExtensions = nil
		chains, err := leaf.Verify(x509.VerifyOptions{
			Roots: roots, Intermediates: inter, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		})
		if err != nil {
			lastErr = err
			continue
		}
		t.remember(s.Name, chains[0])
		return s.Name, nil
	}
	if lastErr == nil {
		lastErr = errors.New("no EK root sets are configured")
	}
	return "", attest.DenySetting(attest.ReasonEKUntrusted, "trust.ekRoots", "EK certificate (issuer %q) does not chain to a TPM vendor root of the policy's trust.ekRoots (add its vendor's CA there, or list the EK in trust.ekInventory): %v", cert.Issuer.String(), lastErr)
}

// remember caches every issuer of a verified chain (all but the leaf).
func (t *ekTrust) remember(set string, chain []*x509.Certificate) {
	if len(chain) < 2 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	notAfter := chain[len(chain)-1].NotAfter
	for i := len(chain) - 1; i >= 1; i-- {
		if chain[i].NotAfter.Before(notAfter) {
			notAfter = chain[i].NotAfter
		}
		// Bound the cache: vendors have few intermediates, but a hostile
		// stream of self-made chains must not grow it without limit
		// (only chains ending at a configured root get here).
		if len(t.verified) >= 4096 {
			return
		}
		t.verified[sha256.Sum256(chain[i].Raw)] = verifiedIssuer{cert: chain[i], set: set, notAfter: notAfter}
	}
}

// checkCriticalExtensions refuses any unhandled critical extension other
// than the TCG SAN.
func checkCriticalExtensions(c *x509.Certificate) error {
	for _, oid := range c.UnhandledCriticalExtensions {
		if !oid.Equal(oidSubjectAltName) {
			return attest.Deny(attest.ReasonEKCertInvalid, "EK certificate has unhandled critical extension %s", oid)
		}
	}
	return nil
}
