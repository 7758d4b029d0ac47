package certs

// Rotation: what the next state is, given the current one and the time.

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

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

func validAt(c *x509.Certificate, now time.Time) bool {
	return !now.Before(c.NotBefore) && now.Before(c.NotAfter)
}

// pastRotation reports whether now is past RotatePercent of c's lifetime.
func pastRotation(c *x509.Certificate, now time.Time) bool {
	life := c.NotAfter.Sub(c.NotBefore)
	return !now.Before(c.NotBefore.Add(life / 100 * RotatePercent))
}
