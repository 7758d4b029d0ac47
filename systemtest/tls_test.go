package systemtest_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/xml"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// sslscanReport is the part of sslscan's XML report the test reads.
type sslscanReport struct {
	Tests []struct {
		Protocols []struct {
			Type    string `xml:"type,attr"`
			Version string `xml:"version,attr"`
			Enabled string `xml:"enabled,attr"`
		} `xml:"protocol"`
		Renegotiation struct {
			Supported string `xml:"supported,attr"`
		} `xml:"renegotiation"`
		Heartbleed []struct {
			Vulnerable string `xml:"vulnerable,attr"`
		} `xml:"heartbleed"`
		Compression []struct {
			Supported string `xml:"supported,attr"`
		} `xml:"compression"`
		Ciphers []struct {
			Status  string `xml:"status,attr"`
			Version string `xml:"sslversion,attr"`
			Cipher  string `xml:"cipher,attr"`
		} `xml:"cipher"`
	} `xml:"ssltest"`
}

// sslscan runs the sslscan scanner (Debian's package; make deps installs
// it) against addr and parses its report.
func sslscan(t *testing.T, addr string) sslscanReport {
	t.Helper()
	bin, err := exec.LookPath("sslscan")
	if err != nil {
		t.Fatalf("sslscan is not installed: apt-get install -y sslscan (make test does this): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--no-colour", "--xml=-", addr).Output()
	if err != nil {
		t.Fatalf("sslscan %s: %v\n%s", addr, err, out)
	}
	var r sslscanReport
	if err := xml.Unmarshal(out, &r); err != nil || len(r.Tests) != 1 {
		t.Fatalf("sslscan report: %v (%d tests)\n%s", err, len(r.Tests), out)
	}
	return r
}

// strongSuite reports whether an OpenSSL-named suite sslscan saw is one the
// Ignition ports may offer: TLS 1.3's, or ECDHE with an AEAD cipher.
func strongSuite(version, name string) bool {
	if version == "TLSv1.3" {
		return strings.HasPrefix(name, "TLS_AES_") || strings.HasPrefix(name, "TLS_CHACHA20_")
	}
	return version == "TLSv1.2" && strings.HasPrefix(name, "ECDHE-") &&
		(strings.HasSuffix(name, "-GCM-SHA256") || strings.HasSuffix(name, "-GCM-SHA384") || strings.HasSuffix(name, "-CHACHA20-POLY1305"))
}

// TestTLSAttacks scans the Ignition port of `nodeproof serve` with a real
// scanner (sslscan) and with a Go client that offers, one at a time, each
// old protocol version, each weak cipher suite and HTTP/2: only TLS 1.2
// and 1.3 with forward-secret AEAD suites are accepted, no renegotiation,
// no compression, no HTTP/2; with --tls-min-version VersionTLS13 only TLS
// 1.3.
func TestTLSAttacks(t *testing.T) {
	e := newAttackEnv(t)

	t.Run("sslscan", func(t *testing.T) {
		r := sslscan(t, e.addr).Tests[0]
		var enabled []string
		for _, p := range r.Protocols {
			if p.Enabled == "1" {
				enabled = append(enabled, strings.ToUpper(p.Type)+"v"+p.Version)
			}
		}
		attacktable.Check(t, "TLS", "sslscan: each protocol version it can offer (SSLv2 and SSLv3 only where its OpenSSL still has them; the Go client below offers TLS 1.0 and 1.1 itself)", "enabled: TLSv1.2 TLSv1.3", "enabled: "+strings.Join(enabled, " "))
		var weak, accepted []string
		for _, c := range r.Ciphers {
			accepted = append(accepted, c.Version+" "+c.Cipher)
			if !strongSuite(c.Version, c.Cipher) {
				weak = append(weak, c.Version+" "+c.Cipher)
			}
		}
		t.Logf("sslscan: accepted %s", strings.Join(accepted, ", "))
		got := "none"
		if len(weak) > 0 {
			got = strings.Join(weak, ", ")
		} else if len(accepted) == 0 {
			got = "no suite accepted at all"
		}
		attacktable.Check(t, "TLS", "sslscan: every cipher suite OpenSSL knows, each tried", "none", got)
		renego := "not supported"
		if r.Renegotiation.Supported != "0" {
			renego = "supported"
		}
		attacktable.Check(t, "TLS", "sslscan: renegotiation", "not supported", renego)
		bleed := "not vulnerable"
		for _, h := range r.Heartbleed {
			if h.Vulnerable != "0" {
				bleed = "vulnerable"
			}
		}
		attacktable.Check(t, "TLS", "sslscan: Heartbleed", "not vulnerable", bleed)
	})

	t.Run("old versions and weak suites", func(t *testing.T) {
		try := func(cfg *tls.Config) string {
			cfg.RootCAs, cfg.ServerName = e.roots, "127.0.0.1"
			c, err := tls.DialWithDialer(dialer("127.0.0.10"), "tcp", e.addr, cfg)
			if err != nil {
				return "handshake refused"
			}
			defer c.Close()
			st := c.ConnectionState()
			return fmt.Sprintf("accepted %s %s", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))
		}
		for _, v := range []uint16{tls.VersionTLS10, tls.VersionTLS11} {
			attacktable.Check(t, "TLS", "a client that speaks only "+tls.VersionName(v), "handshake refused",
				try(&tls.Config{MinVersion: v, MaxVersion: v}))
		}
		// Every suite Go knows that is not ECDHE with an AEAD: its insecure
		// list (RC4, 3DES, RSA key exchange, CBC-SHA256) and the CBC-SHA1
		// suites it still counts as secure.
		var weak []*tls.CipherSuite
		weak = append(weak, tls.InsecureCipherSuites()...)
		for _, s := range tls.CipherSuites() {
			if strings.Contains(s.Name, "_CBC_") {
				weak = append(weak, s)
			}
		}
		for _, s := range weak {
			if !slices.Contains(s.SupportedVersions, tls.VersionTLS12) {
				continue
			}
			attacktable.Check(t, "TLS", "a TLS 1.2 client offering only "+s.Name, "handshake refused",
				try(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{s.ID}}))
		}
	})

	t.Run("HTTP/2", func(t *testing.T) {
		alpn := func(protos ...string) string {
			c, err := tls.DialWithDialer(dialer("127.0.0.10"), "tcp", e.addr, &tls.Config{RootCAs: e.roots, ServerName: "127.0.0.1", NextProtos: protos})
			if err != nil {
				return "handshake refused"
			}
			defer c.Close()
			return "negotiated " + fmt.Sprintf("%q", c.ConnectionState().NegotiatedProtocol)
		}
		attacktable.Check(t, "TLS", "ALPN offering only h2", "handshake refused", alpn("h2"))
		attacktable.Check(t, "TLS", "ALPN offering h2 and http/1.1", `negotiated "http/1.1"`, alpn("h2", "http/1.1"))
		// HTTP/2 with prior knowledge over TLS: the server must not speak it.
		c := e.tlsConn(t, "127.0.0.10")
		defer c.Close()
		io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, _ := io.ReadAll(c)
		got := "no HTTP/2"
		if len(b) >= 9 && b[3] == 0x4 { // an HTTP/2 SETTINGS frame
			got = "HTTP/2 SETTINGS frame answered"
		} else if !bytes.HasPrefix(b, []byte("HTTP/1.1 ")) {
			got = fmt.Sprintf("answered %q", b[:min(len(b), 20)])
		}
		attacktable.Check(t, "TLS", "the HTTP/2 connection preface over TLS (prior knowledge)", "no HTTP/2", got)
	})

	t.Run("--tls-min-version VersionTLS13", func(t *testing.T) {
		s := startServerWith(t, nil, func(c *serve.Config) { c.TLSMinVersion = "VersionTLS13" })
		r := sslscan(t, strings.TrimPrefix(s.url, "https://")).Tests[0]
		var enabled []string
		for _, p := range r.Protocols {
			if p.Enabled == "1" {
				enabled = append(enabled, strings.ToUpper(p.Type)+"v"+p.Version)
			}
		}
		attacktable.Check(t, "TLS", "sslscan against --tls-min-version VersionTLS13", "enabled: TLSv1.3", "enabled: "+strings.Join(enabled, " "))
	})
}
