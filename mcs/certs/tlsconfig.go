package certs

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// DefaultCipherSuites are the TLS 1.2 suites offered when none are
// configured: ECDHE forward secrecy with AEAD ciphers only, for ECDSA and
// RSA serving keys. (TLS 1.3 suites are not configurable in Go and are all
// strong.)
func DefaultCipherSuites() []uint16 {
	return []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	}
}

// TLSConfig is the server configuration for the Ignition port (22623):
//
//   - the certificate comes from r, so rotations are served without a
//     restart;
//   - MinVersion is minVersion, but never below TLS 1.2 (0 means TLS 1.2);
//   - CipherSuites (TLS 1.2) are cipherSuites, or [DefaultCipherSuites]
//     when empty; with an ECDSA serving key (what [Ensure] makes) the list
//     must include an ECDHE_ECDSA suite for TLS 1.2 clients;
//   - NextProtos is only "http/1.1": no HTTP/2 on the Ignition ports;
//   - Certificates stays empty, so that GetCertificate also answers
//     clients that send no SNI (Ignition fetching from an IP address).
//
// Serve it with tls.NewListener(ln, cfg) and http.Server.Serve. If
// http.Server.ServeTLS is used instead, also set the server's Protocols to
// HTTP/1 only (or TLSNextProto to an empty map): ServeTLS otherwise adds
// "h2" to NextProtos.
func TLSConfig(r Served, minVersion uint16, cipherSuites []uint16) *tls.Config {
	if minVersion < tls.VersionTLS12 {
		minVersion = tls.VersionTLS12
	}
	if len(cipherSuites) == 0 {
		cipherSuites = DefaultCipherSuites()
	}
	return &tls.Config{
		MinVersion:     minVersion,
		CipherSuites:   slices.Clone(cipherSuites),
		NextProtos:     []string{"http/1.1"},
		GetCertificate: r.GetCertificate,
	}
}

// ParseTLSMinVersion parses the value of the OpenShift MCS flag
// --tls-min-version, spelled as OpenShift and Kubernetes spell it:
// "VersionTLS12" or "VersionTLS13". Empty means VersionTLS12.
// "VersionTLS10" and "VersionTLS11" are refused: the Ignition ports require
// TLS 1.2 or later.
func ParseTLSMinVersion(name string) (uint16, error) {
	switch strings.TrimSpace(name) {
	case "", "VersionTLS12":
		return tls.VersionTLS12, nil
	case "VersionTLS13":
		return tls.VersionTLS13, nil
	case "VersionTLS10", "VersionTLS11":
		return 0, fmt.Errorf("--tls-min-version %q: below the minimum of the Ignition ports; use VersionTLS12 or VersionTLS13", name)
	default:
		return 0, fmt.Errorf("--tls-min-version %q: unknown TLS version; use VersionTLS12 or VersionTLS13", name)
	}
}

// ParseCipherSuites parses the value of the OpenShift MCS flag
// --tls-cipher-suites: IANA names separated by commas, e.g.
// "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".
// Empty means the defaults (nil). TLS 1.3 suite names (TLS_AES_128_GCM_SHA256
// and the like, which OpenShift TLS profiles list) are accepted and
// omitted from the result, since Go always enables them (a list of only
// TLS 1.3 names thus yields nil: the defaults for TLS 1.2). Unknown names,
// and names Go lists as insecure (RC4, 3DES, RSA key exchange, CBC with
// SHA-256), are errors naming each.
func ParseCipherSuites(list string) ([]uint16, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	secure := map[string]*tls.CipherSuite{}
	for _, s := range tls.CipherSuites() {
		secure[s.Name] = s
	}
	insecure := map[string]bool{}
	for _, s := range tls.InsecureCipherSuites() {
		insecure[s.Name] = true
	}
	var ids []uint16
	var errs []error
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		s, ok := secure[name]
		switch {
		case name == "":
			errs = append(errs, errors.New("empty cipher suite name"))
		case ok && slices.Equal(s.SupportedVersions, []uint16{tls.VersionTLS13}):
			// TLS 1.3: always on in Go.
		case ok:
			if !slices.Contains(ids, s.ID) {
				ids = append(ids, s.ID)
			}
		case insecure[name]:
			errs = append(errs, fmt.Errorf("%s is insecure and not allowed on the Ignition ports", name))
		default:
			errs = append(errs, fmt.Errorf("%s is not a known cipher suite (IANA names, e.g. TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)", name))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("--tls-cipher-suites: %w", errors.Join(errs...))
	}
	return ids, nil
}
