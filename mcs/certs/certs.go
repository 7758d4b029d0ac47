// Package certs keeps the Machine Config Server's CA and serving certificate
// in a state directory, as the Machine Config Operator keeps its
// machine-config-server-ca and machine-config-server-tls: a self-signed CA
// valid for 10 years and a serving certificate it signs, valid for 10 years,
// each replaced once it has passed 80% of its lifetime (8 years).
//
// # Keys
//
// Every key is ECDSA P-256. The CA bundle travels inside every pointer
// config (user data, often capped at 16 KiB), so small certificates matter;
// P-256 certificates are about half the size of RSA-2048 ones. Ignition's
// TLS client is Go's crypto/tls, which has verified ECDSA P-256 chains and
// negotiated ECDHE-ECDSA suites in every release Ignition was built with,
// as have curl/OpenSSL; P-256 is FIPS 186-approved; and key generation is
// fast enough to do on the request path of a test. Keys already on disk in
// other formats (RSA, PKCS#1, SEC 1) are read, so an existing MCO CA can be
// placed in the directory by hand.
//
// # Rotation without breaking existing pointer configs
//
// A pointer config carries the CA bundle of the day it was written and is
// never updated on a user-provisioned cluster. After the CA is rotated, a
// machine booting such a config trusts only the old CA, while new pointer
// configs should trust the new one. nodeproof cross-signs: at rotation the
// new CA is created (self-signed, a new subject and key) and the old CA
// additionally signs a certificate for the new CA's subject and key
// (ca-cross.crt, valid until the old CA expires). The server presents the
// chain [serving, new-CA-signed-by-old-CA]:
//
//   - a client trusting only the old CA builds serving → cross → old CA;
//   - a client trusting the new bundle builds serving → new CA directly
//     (the new CA comes first in the bundle, so even an Ignition that reads
//     only the first certificate of a bundle works);
//   - the old CA key signs nothing after the rotation: serving certificates
//     come only from the new CA, and the old key is no longer kept.
//
// The alternative, continuing to issue from the old CA until it nears
// expiry, would keep the retiring key in use for two more years and break
// every new pointer config consumed by a client that honours only the first
// (newest) CA of a bundle. Once the old CA expires, it leaves the bundle and
// the cross-signed certificate leaves the served chain; old pointer configs
// could not have validated past that day anyway.
//
// # On disk
//
// Every state is a complete generation directory, switched in by one atomic
// rename of a symlink (the scheme Kubernetes uses for projected volumes), so
// the CA, its key, the bundle and the serving pair always change together
// and a crash leaves the previous state or the new one, never a mix:
//
//	dir/
//	  .lock                  flock(2): one Ensure at a time, across processes
//	  current -> gen-000002  the live generation
//	  gen-000002/            0700
//	    ca-bundle.crt        every still-valid CA, newest first (0644)
//	    ca.crt               the active CA, which signs serving certs (0644)
//	    ca.key               its key, PKCS#8 (0600)
//	    ca-cross.crt         active CA signed by its predecessor; while valid (0644)
//	    tls.crt              serving cert, then ca-cross.crt if present (0644)
//	    tls.key              serving key, PKCS#8 (0600)
//
// A generation is written into a fresh temporary directory (each file
// fsynced, then the directory), renamed to gen-N, the parent fsynced, and
// then "current" is replaced by renaming a new symlink over it, and the
// parent fsynced again. Older generations are removed afterwards. Readers
// use the stable paths dir/current/tls.crt and dir/current/tls.key; see
// [Reloader].
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/pemcert"
)

// Validity and rotation policy, as the MCO documents it: 10 years, rotated
// at 80% (8 years).
const (
	// CAValidityYears is the lifetime of a new CA.
	CAValidityYears = 10
	// ServingValidityYears is the longest lifetime of a serving certificate;
	// it never outlives the CA that signs it.
	ServingValidityYears = 10
	// RotatePercent of a certificate's lifetime, once passed, makes Ensure
	// replace it.
	RotatePercent = 80
	// Backdate is subtracted from NotBefore of every new certificate so that
	// a machine whose clock runs somewhat behind still accepts it.
	Backdate = time.Hour
	// CACommonNamePrefix starts the CN of every CA; "@<unix seconds>" follows
	// so that successive CAs have distinct subjects.
	CACommonNamePrefix = "machine-config-server-ca"
)

// File names inside a generation directory.
const (
	CABundleFileName    = "ca-bundle.crt"
	CACertFileName      = "ca.crt"
	CAKeyFileName       = "ca.key"
	CACrossFileName     = "ca-cross.crt"
	ServingCertFileName = "tls.crt"
	ServingKeyFileName  = "tls.key"
	// CurrentLink names the symlink to the live generation.
	CurrentLink = "current"
)

// Options for [Ensure].
type Options struct {
	// Clock returns the current time. Required: it decides validity
	// periods, when to rotate, and which CAs have expired and leave the
	// bundle.
	Clock func() time.Time

	// Hosts are the DNS names and IP addresses the serving certificate is
	// valid for, e.g. "api-int.cluster.example.com". Ignition refuses the
	// server unless the host of the pointer config's URL is among them.
	// Required. A change reissues the serving certificate, never the CA.
	Hosts []string

	// RotateCA rotates the CA now, exactly as at 80% of its life: a new
	// CA, cross-signed by the old one; the old one stays in the bundle
	// until it expires, so pointer configs that trust it keep working.
	// For rotations on demand (a suspected key leak, a drill). It implies
	// a new serving certificate.
	RotateCA bool
	// RotateServing issues a new serving certificate now.
	RotateServing bool

	// testHookBeforeSwap, when set, runs after a new generation directory
	// is complete and before "current" points to it; an error aborts
	// Ensure there, as a crash would.
	testHookBeforeSwap func() error
}

// State is the live state after [Ensure].
type State struct {
	// Dir is the state directory.
	Dir string
	// Generation is the number of the live generation directory.
	Generation int
	// CABundlePEM holds every still-valid CA, newest first: what pointer
	// configs carry under ignition.security.tls.certificateAuthorities.
	CABundlePEM []byte
	// CABundle is CABundlePEM parsed, newest first.
	CABundle []*x509.Certificate
	// CACert is the active CA, which signs serving certificates
	// (CABundle[0]).
	CACert *x509.Certificate
	// CrossSignedCA is CACert's subject and key signed by the previous CA,
	// present while that CA is valid; it follows the serving certificate in
	// the served chain.
	CrossSignedCA *x509.Certificate
	// ServingCert is the serving (leaf) certificate.
	ServingCert *x509.Certificate
	// CABundleFile, CACertFile, ServingCertFile and ServingKeyFile are
	// stable paths through the "current" symlink. ServingCertFile holds
	// the whole chain to present.
	CABundleFile, CACertFile, ServingCertFile, ServingKeyFile string
	// Changes says what this call did, one line per action, for the
	// caller to log; empty when nothing changed.
	Changes []string
}

// material is one generation in memory.
type material struct {
	bundle   []*x509.Certificate
	ca       *x509.Certificate
	caKey    crypto.Signer
	caKeyPEM []byte
	cross    *x509.Certificate
	leaf     *x509.Certificate
	leafKey  crypto.Signer
	leafPEM  []byte // serving key PEM
	leafErr  error  // why the serving pair on disk is unusable
	files    map[string][]byte
}

// Ensure creates the CA and serving certificate in dir on first use and
// afterwards rotates what has passed [RotatePercent] of its lifetime:
//
//   - the CA, when past 80% (or expired): a new CA, cross-signed by the old
//     one while the old one is valid; the old CA stays in the bundle until
//     it expires;
//   - the serving certificate, when past 80%, expired, unreadable (a
//     damaged file), not signed by the active CA, when the CA was rotated,
//     or when Hosts changed;
//   - expired CAs leave the bundle, an expired cross-signed CA leaves the
//     served chain.
//
// Before anything is written, the new state is checked: the serving
// certificate must verify against the bundle, so a serving certificate
// whose CA is not in the bundle is never written. A CA certificate or key
// that cannot be read is an error, never silently replaced: existing
// pointer configs trust that CA.
func Ensure(dir string, o Options) (*State, error) {
	if o.Clock == nil {
		return nil, errors.New("certs: Options.Clock is required")
	}
	hosts, err := normalizeHosts(o.Hosts)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("certs: lock %s: %w", dir, err)
	}
	defer unlock()

	gen, linked, err := currentGeneration(dir)
	if err != nil {
		return nil, err
	}
	var cur *material
	if gen > 0 {
		if cur, err = load(filepath.Join(dir, genName(gen))); err != nil {
			return nil, err
		}
	}
	now := o.Clock()
	next, changes, err := plan(cur, hosts, now, o.RotateCA, o.RotateServing)
	if err != nil {
		return nil, err
	}
	files := next.render()
	if cur == nil || !linked || !sameFiles(cur.files, files) {
		gen++
		if err := writeGeneration(dir, gen, files, o.testHookBeforeSwap); err != nil {
			return nil, err
		}
	}
	removeStale(dir, gen)

	cd := filepath.Join(dir, CurrentLink)
	return &State{
		Dir:             dir,
		Generation:      gen,
		CABundlePEM:     files[CABundleFileName].data,
		CABundle:        next.bundle,
		CACert:          next.ca,
		CrossSignedCA:   next.cross,
		ServingCert:     next.leaf,
		CABundleFile:    filepath.Join(cd, CABundleFileName),
		CACertFile:      filepath.Join(cd, CACertFileName),
		ServingCertFile: filepath.Join(cd, ServingCertFileName),
		ServingKeyFile:  filepath.Join(cd, ServingKeyFileName),
		Changes:         changes,
	}, nil
}

// plan computes the next state from the current one (nil on first use);
// rotateCA and rotateServing force those rotations.
func plan(cur *material, hosts []string, now time.Time, rotateCA, rotateServing bool) (*material, []string, error) {
	next := &material{}
	var changes []string
	caRotated := false
	switch {
	case cur == nil:
		ca, key, keyPEM, err := newCA(now)
		if err != nil {
			return nil, nil, err
		}
		next.ca, next.caKey, next.caKeyPEM = ca, key, keyPEM
		caRotated = true
		changes = append(changes, fmt.Sprintf("created CA %q, valid until %s", ca.Subject.CommonName, ca.NotAfter.UTC().Format(time.RFC3339)))
	case rotateCA && cur.ca.Subject.CommonName == CACommonNamePrefix+"@"+strconv.FormatInt(now.Unix(), 10):
		// CA names carry their creation second: two in one second would
		// share a subject.
		return nil, nil, fmt.Errorf("certs: the CA %q was made this second; rotate it again a second later", cur.ca.Subject.CommonName)
	case !now.Before(cur.ca.NotAfter) || pastRotation(cur.ca, now) || rotateCA:
		ca, key, keyPEM, err := newCA(now)
		if err != nil {
			return nil, nil, err
		}
		next.ca, next.caKey, next.caKeyPEM = ca, key, keyPEM
		caRotated = true
		if validAt(cur.ca, now) {
			cross, err := crossSign(ca, cur.ca, cur.caKey, now)
			if err != nil {
				return nil, nil, err
			}
			next.cross = cross
			why := fmt.Sprintf("%q is past %d%% of its lifetime", cur.ca.Subject.CommonName, RotatePercent)
			if !pastRotation(cur.ca, now) {
				why = fmt.Sprintf("rotation of %q asked for", cur.ca.Subject.CommonName)
			}
			changes = append(changes, fmt.Sprintf("rotated CA: %s; new CA %q, cross-signed by the old one until %s",
				why, ca.Subject.CommonName, cross.NotAfter.UTC().Format(time.RFC3339)))
		} else {
			changes = append(changes, fmt.Sprintf("rotated CA: %q has expired; new CA %q (pointer configs that trust only the old CA no longer work)",
				cur.ca.Subject.CommonName, ca.Subject.CommonName))
		}
	default:
		next.ca, next.caKey, next.caKeyPEM, next.cross = cur.ca, cur.caKey, cur.caKeyPEM, cur.cross
	}
	if next.cross != nil && !validAt(next.cross, now) {
		changes = append(changes, fmt.Sprintf("dropped the cross-signed certificate of %q from the served chain: it expired at %s",
			next.cross.Subject.CommonName, next.cross.NotAfter.UTC().Format(time.RFC3339)))
		next.cross = nil
	}

	// The bundle: the active CA first, then every other still-valid CA,
	// newest first.
	next.bundle = []*x509.Certificate{next.ca}
	if cur != nil {
		var older []*x509.Certificate
		for _, c := range cur.bundle {
			if c.Equal(next.ca) || slices.ContainsFunc(older, c.Equal) {
				continue
			}
			if !validAt(c, now) {
				changes = append(changes, fmt.Sprintf("dropped CA %q from the bundle: it expired at %s", c.Subject.CommonName, c.NotAfter.UTC().Format(time.RFC3339)))
				continue
			}
			older = append(older, c)
		}
		slices.SortStableFunc(older, func(a, b *x509.Certificate) int { return b.NotBefore.Compare(a.NotBefore) })
		next.bundle = append(next.bundle, older...)
	}

	reason := ""
	switch {
	case cur == nil:
		reason = "first use"
	case cur.leaf == nil:
		reason = fmt.Sprintf("the serving certificate on disk is unusable (%v)", cur.leafErr)
	case caRotated:
		reason = "the CA was rotated"
	case cur.leaf.CheckSignatureFrom(next.ca) != nil:
		reason = "it is not signed by the active CA"
	case !slices.Equal(certHosts(cur.leaf), hosts):
		reason = fmt.Sprintf("hosts changed from %v to %v", certHosts(cur.leaf), hosts)
	case !now.Before(cur.leaf.NotAfter):
		reason = "it has expired"
	case pastRotation(cur.leaf, now):
		reason = fmt.Sprintf("it is past %d%% of its lifetime", RotatePercent)
	case rotateServing:
		reason = "rotation asked for"
	}
	if reason != "" {
		leaf, key, keyPEM, err := newServing(next.ca, next.caKey, hosts, now)
		if err != nil {
			return nil, nil, err
		}
		next.leaf, next.leafKey, next.leafPEM = leaf, key, keyPEM
		changes = append(changes, fmt.Sprintf("issued serving certificate for %v, valid until %s: %s",
			hosts, leaf.NotAfter.UTC().Format(time.RFC3339), reason))
	} else {
		next.leaf, next.leafKey, next.leafPEM = cur.leaf, cur.leafKey, cur.leafPEM
	}
	if err := next.check(hosts, now); err != nil {
		return nil, nil, err
	}
	return next, changes, nil
}

// check verifies the invariants of a state before it is written: the
// serving certificate verifies against the bundle, both on its own and via
// the cross-signed CA against the older CAs.
func (m *material) check(hosts []string, now time.Time) error {
	if !m.bundle[0].Equal(m.ca) {
		return errors.New("certs: internal error: the active CA is not first in the bundle")
	}
	if err := m.leaf.CheckSignatureFrom(m.ca); err != nil {
		return fmt.Errorf("certs: internal error: serving certificate not signed by the active CA: %w", err)
	}
	roots := x509.NewCertPool()
	for _, c := range m.bundle {
		roots.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, CurrentTime: now, DNSName: hosts[0], KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := m.leaf.Verify(opts); err != nil {
		return fmt.Errorf("certs: internal error: serving certificate does not verify against the bundle: %w", err)
	}
	if m.cross != nil {
		older := x509.NewCertPool()
		for _, c := range m.bundle[1:] {
			older.AddCert(c)
		}
		inter := x509.NewCertPool()
		inter.AddCert(m.cross)
		opts.Roots, opts.Intermediates = older, inter
		if _, err := m.leaf.Verify(opts); err != nil {
			return fmt.Errorf("certs: internal error: serving certificate does not verify against the previous CA via the cross-signed CA: %w", err)
		}
	}
	return nil
}

type fileData struct {
	data []byte
	mode os.FileMode
}

func (m *material) render() map[string]fileData {
	f := map[string]fileData{
		CABundleFileName:    {encodeCerts(m.bundle...), 0o644},
		CACertFileName:      {encodeCerts(m.ca), 0o644},
		CAKeyFileName:       {m.caKeyPEM, 0o600},
		ServingKeyFileName:  {m.leafPEM, 0o600},
		ServingCertFileName: {encodeCerts(m.leaf), 0o644},
	}
	if m.cross != nil {
		f[CACrossFileName] = fileData{encodeCerts(m.cross), 0o644}
		f[ServingCertFileName] = fileData{encodeCerts(m.leaf, m.cross), 0o644}
	}
	return f
}

func sameFiles(old map[string][]byte, next map[string]fileData) bool {
	if len(old) != len(next) {
		return false
	}
	for name, f := range next {
		b, ok := old[name]
		if !ok || string(b) != string(f.data) {
			return false
		}
	}
	return true
}

// load reads a generation directory. A damaged serving pair is reported in
// leafErr (Ensure replaces it); anything wrong on the CA side is an error.
func load(gdir string) (*material, error) {
	m := &material{files: map[string][]byte{}}
	read := func(name string, optional bool) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(gdir, name))
		if optional && errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err == nil {
			m.files[name] = b
		}
		return b, err
	}
	caErr := func(what string, err error) error {
		return fmt.Errorf("certs: %s in %s is unusable (%v); refusing to replace a CA that existing pointer configs may trust: restore it, or move %s aside to start over with a new CA",
			what, gdir, err, filepath.Dir(gdir))
	}

	b, err := read(CABundleFileName, false)
	if err != nil {
		return nil, caErr("the CA bundle", err)
	}
	if m.bundle, err = pemcert.Parse(b); err != nil {
		return nil, caErr("the CA bundle", err)
	}
	b, err = read(CACertFileName, false)
	if err != nil {
		return nil, caErr("the CA certificate", err)
	}
	cas, err := pemcert.Parse(b)
	if err == nil && len(cas) != 1 {
		err = fmt.Errorf("%d certificates, want 1", len(cas))
	}
	if err != nil {
		return nil, caErr("the CA certificate", err)
	}
	m.ca = cas[0]
	if m.caKeyPEM, err = read(CAKeyFileName, false); err != nil {
		return nil, caErr("the CA key", err)
	}
	if m.caKey, err = parseKey(m.caKeyPEM, m.ca); err != nil {
		return nil, caErr("the CA key", err)
	}
	if !m.ca.IsCA {
		return nil, caErr("the CA certificate", errors.New("not a CA"))
	}
	if !slices.ContainsFunc(m.bundle, m.ca.Equal) {
		return nil, caErr("the CA bundle", errors.New("it lacks the active CA"))
	}
	if b, err = read(CACrossFileName, true); err != nil {
		return nil, caErr("the cross-signed CA", err)
	}
	if b != nil {
		crosses, err := pemcert.Parse(b)
		if err == nil && (len(crosses) != 1 || !samePublicKey(crosses[0].PublicKey, m.ca.PublicKey) ||
			string(crosses[0].RawSubject) != string(m.ca.RawSubject)) {
			err = errors.New("not the active CA's subject and key")
		}
		if err != nil {
			return nil, caErr("the cross-signed CA", err)
		}
		m.cross = crosses[0]
	}

	// The serving pair: any damage is repaired by issuing a new one.
	chainPEM, err1 := read(ServingCertFileName, false)
	keyPEM, err2 := read(ServingKeyFileName, false)
	if err := errors.Join(err1, err2); err != nil {
		m.leafErr = err
		return m, nil
	}
	chain, err := pemcert.Parse(chainPEM)
	if err != nil {
		m.leafErr = fmt.Errorf("%s: %w", ServingCertFileName, err)
		return m, nil
	}
	key, err := parseKey(keyPEM, chain[0])
	if err != nil {
		m.leafErr = fmt.Errorf("%s: %w", ServingKeyFileName, err)
		return m, nil
	}
	m.leaf, m.leafKey, m.leafPEM = chain[0], key, keyPEM
	return m, nil
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: marshal key: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certs: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

func caTemplate(now time.Time, notAfter time.Time) (*x509.Certificate, error) {
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	return &x509.Certificate{
		SerialNumber:          sn,
		NotBefore:             now.Add(-Backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}, nil
}

// newCA makes a self-signed CA. Its path length allows one intermediate:
// the next CA cross-signed by this one.
func newCA(now time.Time) (*x509.Certificate, crypto.Signer, []byte, error) {
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl, err := caTemplate(now, now.AddDate(CAValidityYears, 0, 0))
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl.Subject = pkix.Name{CommonName: CACommonNamePrefix + "@" + strconv.FormatInt(now.Unix(), 10)}
	tmpl.MaxPathLen = 1
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return cert, key, keyPEM, nil
}

// crossSign makes a certificate for ca's subject and key, issued by
// oldCA, valid until the earlier of the two expires. It may sign only
// end-entity certificates.
func crossSign(ca, oldCA *x509.Certificate, oldKey crypto.Signer, now time.Time) (*x509.Certificate, error) {
	notAfter := ca.NotAfter
	if oldCA.NotAfter.Before(notAfter) {
		notAfter = oldCA.NotAfter
	}
	tmpl, err := caTemplate(now, notAfter)
	if err != nil {
		return nil, err
	}
	tmpl.RawSubject = ca.RawSubject
	tmpl.SubjectKeyId = ca.SubjectKeyId
	tmpl.MaxPathLenZero = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, oldCA, ca.PublicKey, oldKey)
	if err != nil {
		return nil, fmt.Errorf("certs: cross-sign CA: %w", err)
	}
	return x509.ParseCertificate(der)
}

func newServing(ca *x509.Certificate, caKey crypto.Signer, hosts []string, now time.Time) (*x509.Certificate, crypto.Signer, []byte, error) {
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, nil, err
	}
	notAfter := now.AddDate(ServingValidityYears, 0, 0)
	if ca.NotAfter.Before(notAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: hosts[0]},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs: create serving certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return cert, key, keyPEM, nil
}

func validAt(c *x509.Certificate, now time.Time) bool {
	return !now.Before(c.NotBefore) && now.Before(c.NotAfter)
}

// pastRotation reports whether now is past RotatePercent of c's lifetime.
func pastRotation(c *x509.Certificate, now time.Time) bool {
	life := c.NotAfter.Sub(c.NotBefore)
	return !now.Before(c.NotBefore.Add(life / 100 * RotatePercent))
}

// normalizeHosts lower-cases DNS names, canonicalises IPs, and sorts and
// de-duplicates them, DNS names first (the order of a certificate's SANs).
func normalizeHosts(in []string) ([]string, error) {
	var dns, ips []string
	for _, h := range in {
		h = strings.TrimSpace(h)
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip.String())
			continue
		}
		h = strings.TrimSuffix(strings.ToLower(h), ".")
		if err := checkDNSName(h); err != nil {
			return nil, err
		}
		dns = append(dns, h)
	}
	slices.Sort(dns)
	slices.Sort(ips)
	out := append(slices.Compact(dns), slices.Compact(ips)...)
	if len(out) == 0 {
		return nil, errors.New("certs: Options.Hosts is empty: the serving certificate needs at least one DNS name or IP address")
	}
	return out, nil
}

func checkDNSName(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("certs: host %q is not a DNS name or IP address", h)
	}
	for _, label := range strings.Split(h, ".") {
		ok := len(label) > 0 && len(label) <= 63 && label[0] != '-' && label[len(label)-1] != '-'
		for _, r := range label {
			ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
		}
		if !ok {
			return fmt.Errorf("certs: host %q is not a DNS name or IP address", h)
		}
	}
	return nil
}

// certHosts lists a certificate's SANs in normalizeHosts order.
func certHosts(c *x509.Certificate) []string {
	var in []string
	in = append(in, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		in = append(in, ip.String())
	}
	out, _ := normalizeHosts(in)
	return out
}

func encodeCerts(certs ...*x509.Certificate) []byte {
	var b []byte
	for _, c := range certs {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return b
}

// parseKey parses a PEM private key (PKCS#8, SEC 1 or PKCS#1) and checks
// that it belongs to cert.
func parseKey(b []byte, cert *x509.Certificate) (crypto.Signer, error) {
	block, rest := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM private key")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("trailing data after the private key")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		err = fmt.Errorf("unexpected PEM block %q", block.Type)
	}
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported key type %T", key)
	}
	if !samePublicKey(signer.Public(), cert.PublicKey) {
		return nil, errors.New("private key does not match the certificate")
	}
	return signer, nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}
