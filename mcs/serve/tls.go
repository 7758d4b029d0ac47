package serve

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
)

// tlsConfig is the secure port's TLS configuration, with the certificate
// from --cert, the cluster's objects (the keeper's) or the state directory.
func (c Config) tlsConfig(keeper *cluster.Keeper) (*tls.Config, certs.Served, error) {
	minV, err := certs.ParseTLSMinVersion(c.TLSMinVersion)
	if err != nil {
		return nil, nil, err
	}
	var suites []uint16
	if c.TLSCipherSuite != "" {
		if suites, err = certs.ParseCipherSuites(c.TLSCipherSuite); err != nil {
			return nil, nil, err
		}
	}
	if c.CABundleFile != "" && c.CertFile == "" {
		return nil, nil, errors.New("--ca-bundle is the CA bundle of --cert; without --cert nodeproof keeps its own")
	}
	certFile, keyFile := c.CertFile, c.KeyFile
	switch {
	case c.CertFile != "":
		if keyFile == "" {
			return nil, nil, errors.New("--cert needs --key")
		}
		c.Log.Info("serving the certificate given by --cert: nodeproof rotates nothing (renew it, and its --ca-bundle, yourself; both are re-read when they change)", "cert", c.CertFile)
	case keeper.KeepsCertificates():
		return certs.TLSConfig(keeper.Serving(), minV, suites), keeper.Serving(), nil
	default:
		st, err := certs.Ensure(filepath.Join(c.StateDir, "certs"), certs.Options{Clock: c.Clock, Hosts: c.Hosts})
		if err != nil {
			return nil, nil, err
		}
		for _, ch := range st.Changes {
			c.Log.Info("certificates", "change", ch)
		}
		certFile, keyFile = st.ServingCertFile, st.ServingKeyFile
	}
	r, err := certs.NewReloader(certFile, keyFile, c.Clock)
	if err != nil {
		return nil, nil, err
	}
	return certs.TLSConfig(r, minV, suites), r, nil
}

// caBundle is the CA bundle pointer configs should carry: --ca-bundle
// with --cert (read on every call: a rotated file is picked up), none with
// --cert alone, nodeproof's own when it manages certificates.
func (c Config) caBundle() ([]byte, error) {
	if c.bundleFrom != nil {
		return c.bundleFrom()
	}
	if c.CABundleFile != "" {
		b, err := os.ReadFile(c.CABundleFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-bundle: %w", err)
		}
		return b, nil
	}
	if c.CertFile != "" {
		return nil, nil
	}
	return os.ReadFile(filepath.Join(c.StateDir, "certs", "current", certs.CABundleFileName))
}
