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
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
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

// Next is [Ensure] for a keeper of the state other than a directory (the
// cluster's objects, mcs/certs/kubecerts): from the current generation cur
// (empty on first use; where names the place of each file and hint ends a
// refusal), it returns the next generation and what it holds, with the
// same rotations and the same checks. Nothing is written: the caller
// stores next, and stores nothing when Changes is empty and cur already
// holds exactly next. The State's paths are empty.
func Next(cur Files, where Where, hint string, o Options) (next Files, st *State, err error) {
	if o.Clock == nil {
		return nil, nil, errors.New("certs: Options.Clock is required")
	}
	hosts, err := normalizeHosts(o.Hosts)
	if err != nil {
		return nil, nil, err
	}
	var m *material
	if len(cur) > 0 {
		if m, err = loadFiles(cur, where, hint); err != nil {
			return nil, nil, err
		}
	}
	n, changes, err := plan(m, hosts, o.Clock(), o.RotateCA, o.RotateServing)
	if err != nil {
		return nil, nil, err
	}
	next = Files{}
	for name, f := range n.render() {
		next[name] = f.data
	}
	return next, &State{
		CABundlePEM:   next[CABundleFileName],
		CABundle:      n.bundle,
		CACert:        n.ca,
		CrossSignedCA: n.cross,
		ServingCert:   n.leaf,
		Changes:       changes,
	}, nil
}

// ErrNone: the state directory holds no CA yet.
var ErrNone = errors.New("certs: no CA yet")

// Read returns the live state in dir as it is, writing nothing: no CA
// made, nothing rotated, no lock file (a view: `nodeproof ca show`).
// ErrNone when dir holds no generation.
func Read(dir string) (*State, error) {
	gen, _, err := currentGeneration(dir)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && gen == 0) {
		return nil, fmt.Errorf("%w in %s", ErrNone, dir)
	}
	if err != nil {
		return nil, err
	}
	m, err := load(filepath.Join(dir, genName(gen)))
	if err != nil {
		return nil, err
	}
	if m.leafErr != nil {
		return nil, fmt.Errorf("certs: the serving certificate in %s: %w", filepath.Join(dir, genName(gen)), m.leafErr)
	}
	cd := filepath.Join(dir, CurrentLink)
	return &State{
		Dir: dir, Generation: gen, CABundlePEM: m.files[CABundleFileName], CABundle: m.bundle, CACert: m.ca, CrossSignedCA: m.cross,
		ServingCert: m.leaf, CABundleFile: filepath.Join(cd, CABundleFileName), CACertFile: filepath.Join(cd, CACertFileName),
		ServingCertFile: filepath.Join(cd, ServingCertFileName), ServingKeyFile: filepath.Join(cd, ServingKeyFileName),
	}, nil
}

// Names are a certificate's DNS names and IP addresses, as Hosts lists
// them.
func Names(c *x509.Certificate) []string {
	out := append([]string(nil), c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}
