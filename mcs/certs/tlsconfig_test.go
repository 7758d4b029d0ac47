package certs

import (
	"crypto/tls"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestTLSConfigHandshake(t *testing.T) {
	clk := &fakeClock{t: t0}
	st, err := Ensure(t.TempDir(), Options{Clock: clk.Now, Hosts: testHosts})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name        string
		minVersion  uint16
		suites      []uint16
		client      *tls.Config
		wantErr     string
		wantVersion uint16
		wantSuite   uint16
	}{
		{
			name:    "a TLS 1.1 client is refused",
			client:  &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11},
			wantErr: "protocol version",
		},
		{
			name:       "a configured minimum below 1.2 is raised to 1.2",
			minVersion: tls.VersionTLS10,
			client:     &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11},
			wantErr:    "protocol version",
		},
		{
			name:        "TLS 1.2 with h2 offered negotiates http/1.1",
			client:      &tls.Config{MaxVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}},
			wantVersion: tls.VersionTLS12,
		},
		{
			name:        "TLS 1.3 with h2 offered negotiates http/1.1",
			client:      &tls.Config{NextProtos: []string{"h2", "http/1.1"}},
			wantVersion: tls.VersionTLS13,
		},
		{
			name:    "a client that speaks only h2 is refused",
			client:  &tls.Config{NextProtos: []string{"h2"}},
			wantErr: "no application protocol",
		},
		{
			name:       "minimum TLS 1.3 refuses a TLS 1.2 client",
			minVersion: tls.VersionTLS13,
			client:     &tls.Config{MaxVersion: tls.VersionTLS12},
			wantErr:    "protocol version",
		},
		{
			name:        "configured cipher suites are used",
			suites:      []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384},
			client:      &tls.Config{MaxVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
			wantVersion: tls.VersionTLS12,
			wantSuite:   tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		},
		{
			name:    "a client with only CBC suites is refused by the defaults",
			client:  &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}},
			wantErr: "handshake failure",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ts, _ := startServer(t, st, clk, c.minVersion, c.suites)
			cs, err := handshake(ts, clk, c.client, st.CABundle...)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("handshake error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !cs.PeerCertificates[0].Equal(st.ServingCert) {
				t.Errorf("not served the Reloader's certificate")
			}
			if cs.Version != c.wantVersion {
				t.Errorf("version %x, want %x", cs.Version, c.wantVersion)
			}
			if cs.NegotiatedProtocol != "http/1.1" {
				t.Errorf("ALPN %q, want http/1.1", cs.NegotiatedProtocol)
			}
			if c.wantSuite != 0 && cs.CipherSuite != c.wantSuite {
				t.Errorf("suite %s, want %s", tls.CipherSuiteName(cs.CipherSuite), tls.CipherSuiteName(c.wantSuite))
			}
		})
	}
}

// An HTTP client that would use HTTP/2 gets HTTP/1.1.
func TestTLSConfigNoHTTP2(t *testing.T) {
	clk := &fakeClock{t: t0}
	st, err := Ensure(t.TempDir(), Options{Clock: clk.Now, Hosts: testHosts})
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := startServer(t, st, clk, 0, nil)
	client := &http.Client{Transport: &http.Transport{
		ForceAttemptHTTP2: true,
		TLSClientConfig:   &tls.Config{RootCAs: pool(st.CABundle...), ServerName: testHost, Time: clk.Now},
	}}
	resp, err := client.Get("https://" + ts)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.Proto != "HTTP/1.1" || string(body) != "HTTP/1.1" || resp.TLS.NegotiatedProtocol != "http/1.1" {
		t.Fatalf("proto %s, server saw %s, ALPN %q", resp.Proto, body, resp.TLS.NegotiatedProtocol)
	}
}

func TestParseTLSMinVersion(t *testing.T) {
	cases := []struct {
		name, in string
		want     uint16
		wantErr  string
	}{
		{"empty is TLS 1.2", "", tls.VersionTLS12, ""},
		{"VersionTLS12", "VersionTLS12", tls.VersionTLS12, ""},
		{"VersionTLS13", "VersionTLS13", tls.VersionTLS13, ""},
		{"VersionTLS11 is too old", "VersionTLS11", 0, "below the minimum"},
		{"VersionTLS10 is too old", "VersionTLS10", 0, "below the minimum"},
		{"numeric spelling is unknown", "1.2", 0, "unknown TLS version"},
		{"lower case is unknown", "versiontls12", 0, "unknown TLS version"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseTLSMinVersion(c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), "--tls-min-version") {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %x, %v; want %x", got, err, c.want)
			}
		})
	}
}

func TestParseCipherSuites(t *testing.T) {
	cases := []struct {
		name, in string
		want     []uint16
		wantErr  []string
	}{
		{name: "empty means defaults", in: "", want: nil},
		{
			name: "OpenShift intermediate profile (IANA)",
			in: "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384,TLS_CHACHA20_POLY1305_SHA256," +
				"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256," +
				"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384," +
				"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
			want: []uint16{
				tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
				tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
				tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
			},
		},
		{name: "only TLS 1.3 names leave the TLS 1.2 defaults", in: "TLS_AES_128_GCM_SHA256", want: nil},
		{name: "duplicates collapse", in: "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", want: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}},
		{name: "OpenSSL names are unknown", in: "ECDHE-ECDSA-AES128-GCM-SHA256", wantErr: []string{"ECDHE-ECDSA-AES128-GCM-SHA256 is not a known cipher suite"}},
		{
			name:    "insecure suites are refused, each named",
			in:      "TLS_RSA_WITH_3DES_EDE_CBC_SHA,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_RSA_WITH_AES_128_GCM_SHA256",
			wantErr: []string{"TLS_RSA_WITH_3DES_EDE_CBC_SHA is insecure", "TLS_RSA_WITH_AES_128_GCM_SHA256 is insecure"},
		},
		{name: "an empty entry is an error", in: "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,,", wantErr: []string{"empty cipher suite name"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseCipherSuites(c.in)
			if len(c.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, got %v", got)
				}
				for _, w := range append(c.wantErr, "--tls-cipher-suites") {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestTLSConfigFields(t *testing.T) {
	r := &Reloader{}
	cfg := TLSConfig(r, 0, nil)
	if cfg.MinVersion != tls.VersionTLS12 || !slices.Equal(cfg.NextProtos, []string{"http/1.1"}) ||
		!slices.Equal(cfg.CipherSuites, DefaultCipherSuites()) || cfg.GetCertificate == nil {
		t.Fatalf("unexpected config %+v", cfg)
	}
	for _, id := range cfg.CipherSuites {
		if slices.ContainsFunc(tls.InsecureCipherSuites(), func(s *tls.CipherSuite) bool { return s.ID == id }) {
			t.Errorf("default suite %s is insecure", tls.CipherSuiteName(id))
		}
	}
}

// Ignition dialing an IP address sends no SNI; it must still get the
// Reloader's certificate.
func TestTLSConfigNoSNI(t *testing.T) {
	clk := &fakeClock{t: t0}
	st, err := Ensure(t.TempDir(), Options{Clock: clk.Now, Hosts: testHosts})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startServer(t, st, clk, 0, nil)
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // only to look at what is served
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if cs := conn.ConnectionState(); cs.ServerName != "" || !cs.PeerCertificates[0].Equal(st.ServingCert) {
		t.Fatalf("served %s to a client without SNI", cs.PeerCertificates[0].Subject)
	}
}
