package aws

import (
	"crypto/rsa"
	"crypto/x509"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/nodeproof/nodeproof/pemcert"
)

// shippedCerts are AWS's published RSA-2048 instance identity certificates,
// one file per Region; certs/README.md names their source.
//
//go:embed certs/*.pem
var shippedCerts embed.FS

// regionRE is the shape of a Region name ("us-east-1", "us-gov-west-1",
// "cn-northwest-1"), checked before a name selects a certificate or a file.
var regionRE = regexp.MustCompile(`^[a-z]{2,8}(-[a-z]+)+-[0-9]{1,3}$`)

// RegionCerts maps an AWS Region to the certificates whose keys may sign the
// rsa2048 PKCS#7 of documents from that Region. More than one certificate
// per Region allows a rotation. A RegionCerts is immutable after it is made
// and safe for concurrent use.
type RegionCerts struct {
	m map[string][]*x509.Certificate
}

// NewRegionCerts returns a RegionCerts holding a copy of m. The verifier
// checks, when it is made, that every key is RSA of at least 2048 bits.
func NewRegionCerts(m map[string][]*x509.Certificate) *RegionCerts {
	rc := &RegionCerts{m: make(map[string][]*x509.Certificate, len(m))}
	for region, certs := range m {
		rc.m[region] = slices.Clone(certs)
	}
	return rc
}

// DefaultRegionCerts returns the certificates AWS publishes for the rsa2048
// signature, as shipped in this package (certs/, see its README). Each call
// parses them afresh; there is no package state.
func DefaultRegionCerts() (*RegionCerts, error) {
	sub, err := fs.Sub(shippedCerts, "certs")
	if err != nil {
		return nil, err
	}
	return loadRegionCerts(sub)
}

// LoadRegionCerts reads a directory with one file per Region, named
// "<region>.pem", each holding one or more PEM CERTIFICATE blocks with RSA
// keys of at least 2048 bits. Other files are ignored; a .pem file that is
// not such a file is an error, and so is a directory without any.
func LoadRegionCerts(dir string) (*RegionCerts, error) {
	return loadRegionCerts(os.DirFS(dir))
}

func loadRegionCerts(fsys fs.FS) (*RegionCerts, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("aws: region certificates: %w", err)
	}
	m := make(map[string][]*x509.Certificate)
	for _, e := range entries {
		name := e.Name()
		region, ok := strings.CutSuffix(name, ".pem")
		if !ok || e.IsDir() {
			continue
		}
		if !regionRE.MatchString(region) {
			return nil, fmt.Errorf("aws: region certificates: %q is not named <region>.pem", name)
		}
		b, err := fs.ReadFile(fsys, path.Clean(name))
		if err != nil {
			return nil, fmt.Errorf("aws: region certificates: %w", err)
		}
		certs, err := pemcert.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("aws: region certificates: %s: %w", name, err)
		}
		m[region] = certs
	}
	if len(m) == 0 {
		return nil, errors.New("aws: region certificates: no <region>.pem files")
	}
	rc := &RegionCerts{m: m}
	if err := rc.check(); err != nil {
		return nil, err
	}
	return rc, nil
}

// check refuses a set with no Region, a malformed Region name, a Region
// without certificates or a key that is not RSA of at least 2048 bits.
func (rc *RegionCerts) check() error {
	if rc == nil || len(rc.m) == 0 {
		return errors.New("aws: no region certificates")
	}
	for region, certs := range rc.m {
		if !regionRE.MatchString(region) {
			return fmt.Errorf("aws: region certificates: %q is not a region name", region)
		}
		if len(certs) == 0 {
			return fmt.Errorf("aws: region certificates: none for %s", region)
		}
		for _, c := range certs {
			if c == nil {
				return fmt.Errorf("aws: region certificates: nil certificate for %s", region)
			}
			pub, ok := c.PublicKey.(*rsa.PublicKey)
			if !ok {
				return fmt.Errorf("aws: region certificates: %s: key is %T, not RSA", region, c.PublicKey)
			}
			if pub.N.BitLen() < 2048 {
				return fmt.Errorf("aws: region certificates: %s: RSA key of %d bits (want >= 2048)", region, pub.N.BitLen())
			}
		}
	}
	return nil
}

// Regions returns the Regions with certificates, sorted.
func (rc *RegionCerts) Regions() []string {
	var out []string
	for r := range rc.m {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// Certificates returns the certificates of a Region (a copy of the slice).
func (rc *RegionCerts) Certificates(region string) []*x509.Certificate {
	return slices.Clone(rc.m[region])
}
