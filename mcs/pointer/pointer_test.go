package pointer

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/url"
	"strings"
	"testing"
	"time"

	ignconfig "github.com/coreos/ignition/v2/config"
	"github.com/vincent-petithory/dataurl"

	"github.com/nodeproof/nodeproof/mcs/certs"
)

const workerURL = "https://api-int.example.com:22623/config/worker"

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// bundles returns a one-CA bundle and a two-CA bundle (after a rotation),
// as certs.Ensure makes them.
func bundles(t *testing.T) (one, two []byte) {
	t.Helper()
	dir := t.TempDir()
	now := t0
	clock := func() time.Time { return now }
	st, err := certs.Ensure(dir, certs.Options{Clock: clock, Hosts: []string{"api-int.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	one = st.CABundlePEM
	now = t0.AddDate(8, 2, 0)
	st, err = certs.Ensure(dir, certs.Options{Clock: clock, Hosts: []string{"api-int.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.CABundle) != 2 {
		t.Fatal("no rotation")
	}
	return one, st.CABundlePEM
}

// decodeCA returns the CA bundle carried by a parsed config, decoded the
// way Ignition decodes data URLs.
func decodeCA(t *testing.T, source *string) []byte {
	t.Helper()
	if source == nil {
		t.Fatal("no CA source")
	}
	du, err := dataurl.DecodeString(*source)
	if err != nil {
		t.Fatal(err)
	}
	if du.MediaType.ContentType() != "text/plain" || du.Params["charset"] != "utf-8" || du.Encoding != dataurl.EncodingBase64 {
		t.Errorf("data URL type %s %v %s", du.MediaType.ContentType(), du.Params, du.Encoding)
	}
	return du.Data
}

func TestBuildEachVersion(t *testing.T) {
	one, _ := bundles(t)
	cases := []struct {
		name, version, want string
	}{
		{"default is what openshift-install writes", "", "3.2.0"},
		{"3.1.0", "3.1.0", "3.1.0"},
		{"3.2.0", "3.2.0", "3.2.0"},
		{"3.3.0", "3.3.0", "3.3.0"},
		{"3.4.0", "3.4.0", "3.4.0"},
		{"3.5.0", "3.5.0", "3.5.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw, err := Build(Options{URL: workerURL, CABundle: one, Token: "s3cret", Version: c.version, HTTPTotal: 90 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			// That version's own parser.
			if _, rpt, err := parsers[c.want](raw); err != nil || len(rpt.Entries) != 0 {
				t.Fatalf("Ignition %s: %v %s", c.want, err, rpt)
			}
			// What Ignition does at boot: parse any version, translate to the newest.
			cfg, rpt, err := ignconfig.Parse(raw)
			if err != nil || len(rpt.Entries) != 0 {
				t.Fatalf("ignition config.Parse: %v %s", err, rpt)
			}
			var head struct {
				Ignition struct{ Version string }
			}
			if err := json.Unmarshal(raw, &head); err != nil || head.Ignition.Version != c.want {
				t.Errorf("version %q, want %q (%v)", head.Ignition.Version, c.want, err)
			}
			ign := cfg.Ignition
			if len(ign.Config.Merge) != 1 || *ign.Config.Merge[0].Source != workerURL {
				t.Fatalf("merge %+v", ign.Config.Merge)
			}
			h := ign.Config.Merge[0].HTTPHeaders
			if len(h) != 1 || h[0].Name != "Authorization" || *h[0].Value != "Bearer s3cret" {
				t.Errorf("headers %+v", h)
			}
			if cas := ign.Security.TLS.CertificateAuthorities; len(cas) != 1 || string(decodeCA(t, cas[0].Source)) != string(one) {
				t.Errorf("CA bundle does not round-trip")
			}
			if ign.Timeouts.HTTPTotal == nil || *ign.Timeouts.HTTPTotal != 90 {
				t.Errorf("httpTotal %v", ign.Timeouts.HTTPTotal)
			}
			for _, empty := range []string{"{}", "[]", "passwd", "storage", "systemd", "replace", "proxy"} {
				if strings.Contains(string(raw), empty) {
					t.Errorf("config holds %q: %s", empty, raw)
				}
			}
		})
	}
}

// The default output has exactly the shape of openshift-install's worker.ign.
func TestBuildShape(t *testing.T) {
	one, _ := bundles(t)
	raw, err := Build(Options{URL: workerURL, CABundle: one})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"ignition":{"config":{"merge":[{"source":"https://api-int.example.com:22623/config/worker"}]},` +
		`"security":{"tls":{"certificateAuthorities":[{"source":"data:text/plain;charset=utf-8;base64,` +
		base64.StdEncoding.EncodeToString(one) + `"}]}},"version":"3.2.0"}}`
	if string(raw) != want {
		t.Fatalf("got\n%s\nwant\n%s", raw, want)
	}
}

func TestBuildToken(t *testing.T) {
	one, _ := bundles(t)
	// A token as the enhancement makes one: base64 of 32 random bytes,
	// with characters that need escaping in a URL.
	tok := "q+8/Zk1w3XyZ0mN5vP2rT7uB9cD4eF6gH8iJ0kL2mN4="
	cases := []struct {
		name       string
		token      string
		inURL      bool
		wantHeader bool
		wantQuery  bool
	}{
		{name: "no token", token: ""},
		{name: "token as Authorization header (default)", token: tok, wantHeader: true},
		{name: "token in the URL", token: tok, inURL: true, wantQuery: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw, err := Build(Options{URL: workerURL, CABundle: one, Token: c.token, TokenInURL: c.inURL})
			if err != nil {
				t.Fatal(err)
			}
			cfg, _, err := ignconfig.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			m := cfg.Ignition.Config.Merge[0]
			u, err := url.Parse(*m.Source)
			if err != nil {
				t.Fatal(err)
			}
			gotQuery := u.Query().Get("token")
			if c.wantQuery != (gotQuery != "") || (c.wantQuery && gotQuery != tok) {
				t.Errorf("query token %q", gotQuery)
			}
			if c.wantQuery && u.RawQuery == "token="+tok {
				t.Errorf("token not escaped in the URL: %s", u.RawQuery)
			}
			if c.wantHeader != (len(m.HTTPHeaders) == 1) || (c.wantHeader && *m.HTTPHeaders[0].Value != "Bearer "+tok) {
				t.Errorf("headers %+v", m.HTTPHeaders)
			}
			if !c.wantHeader && strings.Contains(string(raw), "httpHeaders") {
				t.Errorf("headers present: %s", raw)
			}
			// The token appears once, or not at all (escaped in the URL).
			n := strings.Count(string(raw), tok) + strings.Count(string(raw), url.QueryEscape(tok))
			if want := map[bool]int{true: 1, false: 0}[c.token != ""]; n != want {
				t.Errorf("token appears %d times, want %d: %s", n, want, raw)
			}
		})
	}
}

func TestBuildCABundleRoundTrip(t *testing.T) {
	_, two := bundles(t)
	raw, err := Build(Options{URL: workerURL, CABundle: two})
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := ignconfig.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	got := decodeCA(t, cfg.Ignition.Security.TLS.CertificateAuthorities[0].Source)
	if string(got) != string(two) {
		t.Fatal("bundle changed on the way")
	}
	// As Ignition reads a bundle: every PEM block, newest CA first.
	var cas []*x509.Certificate
	for rest := got; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		cas = append(cas, c)
	}
	if len(cas) != 2 || !cas[0].NotBefore.After(cas[1].NotBefore) {
		t.Fatalf("want two CAs, newest first")
	}
}

func TestBuildOptions(t *testing.T) {
	one, _ := bundles(t)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}})
	cases := []struct {
		name    string
		o       Options
		wantErr string // empty: must build
	}{
		{"http on the secure port", Options{URL: "http://api-int.example.com:22623/config/worker", CABundle: one, AllowPlainHTTP: true}, "TLS port"},
		{"http not explicitly allowed", Options{URL: "http://api-int.example.com:22624/config/worker"}, "set AllowPlainHTTP"},
		{"http when allowed, on the plain port", Options{URL: "http://api-int.example.com:22624/config/worker", AllowPlainHTTP: true}, ""},
		{"a token never goes over http", Options{URL: "http://api-int.example.com:22624/config/worker", AllowPlainHTTP: true, Token: "t"}, "never sent in the clear"},
		{"https on the plain port", Options{URL: "https://api-int.example.com:22624/config/worker", CABundle: one}, "plain-HTTP port"},
		{"https on another port", Options{URL: "https://mcs.example.com:8443/config/infra", CABundle: one}, ""},
		{"IP host and dotted pool", Options{URL: "https://192.0.2.10:22623/config/worker.rt-1", CABundle: one}, ""},
		{"no pool", Options{URL: "https://api-int.example.com:22623/config/", CABundle: one}, "/config/<pool>"},
		{"root path", Options{URL: "https://api-int.example.com:22623/", CABundle: one}, "/config/<pool>"},
		{"no path", Options{URL: "https://api-int.example.com:22623", CABundle: one}, "/config/<pool>"},
		{"nested path", Options{URL: "https://api-int.example.com:22623/config/worker/x", CABundle: one}, "/config/<pool>"},
		{"upper-case pool", Options{URL: "https://api-int.example.com:22623/config/Worker", CABundle: one}, "/config/<pool>"},
		{"escaped path", Options{URL: "https://api-int.example.com:22623/config/work%2Fer", CABundle: one}, "escaped"},
		{"query in the URL", Options{URL: workerURL + "?token=x", CABundle: one}, "query"},
		{"fragment", Options{URL: workerURL + "#x", CABundle: one}, "fragment"},
		{"user info", Options{URL: "https://u:p@api-int.example.com:22623/config/worker", CABundle: one}, "user info"},
		{"other scheme", Options{URL: "tftp://api-int.example.com/config/worker", CABundle: one}, "https://"},
		{"no host", Options{URL: "https:///config/worker", CABundle: one}, "no host"},
		{"no CA for https", Options{URL: workerURL}, "CABundle is required"},
		{"CA bundle not PEM", Options{URL: workerURL, CABundle: []byte("hello")}, "not a PEM certificate"},
		{"CA bundle with trailing junk", Options{URL: workerURL, CABundle: append(append([]byte{}, one...), "junk"...)}, "not a PEM certificate"},
		{"a key in the CA bundle", Options{URL: workerURL, CABundle: append(append([]byte{}, one...), keyPEM...)}, `"PRIVATE KEY"`},
		{"token with a space", Options{URL: workerURL, CABundle: one, Token: "a b"}, "printable ASCII"},
		{"token with a newline", Options{URL: workerURL, CABundle: one, Token: "a\nAuthorization: x"}, "printable ASCII"},
		{"token too long", Options{URL: workerURL, CABundle: one, Token: strings.Repeat("a", MaxTokenLength+1)}, "longer than"},
		{"spec 3.0.0 has no httpHeaders", Options{URL: workerURL, CABundle: one, Version: "3.0.0"}, "not supported"},
		{"experimental spec", Options{URL: workerURL, CABundle: one, Version: "3.6.0-experimental"}, "not supported"},
		{"spec 2.2.0", Options{URL: workerURL, CABundle: one, Version: "2.2.0"}, "not supported"},
		{"negative timeout", Options{URL: workerURL, CABundle: one, HTTPTotal: -time.Second}, "negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw, err := Build(c.o)
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := ignconfig.Parse(raw); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err %v, want %q", err, c.wantErr)
			}
		})
	}
}

func TestBuildHTTPTotalRoundsUp(t *testing.T) {
	one, _ := bundles(t)
	raw, err := Build(Options{URL: workerURL, CABundle: one, HTTPTotal: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"timeouts":{"httpTotal":2}`) {
		t.Fatalf("%s", raw)
	}
}
