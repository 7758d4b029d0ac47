// Package pointer builds Ignition pointer configs like the worker.ign that
// openshift-install writes (and the *-user-data secrets the Machine API
// uses): a config with nothing but where to fetch the real one and whom to
// trust for that fetch,
//
//	{"ignition":{
//	  "config":{"merge":[{"source":"https://api-int.example.com:22623/config/worker",
//	                      "httpHeaders":[{"name":"Authorization","value":"Bearer <token>"}]}]},
//	  "security":{"tls":{"certificateAuthorities":[{"source":"data:text/plain;charset=utf-8;base64,<CA bundle>"}]}},
//	  "version":"3.2.0"}}
//
// The config is made with github.com/coreos/ignition/v2's types for the
// chosen spec version and checked with that version's Parse before it is
// returned. The CA bundle is carried as given, newest CA first (as
// certs.State.CABundlePEM is), in one entry: current Ignition adds every
// certificate of a bundle, and one that reads only the first still gets
// the newest CA, which is the one the server's certificate chains to.
package pointer

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/coreos/vcontext/report"

	v31 "github.com/coreos/ignition/v2/config/v3_1"
	t31 "github.com/coreos/ignition/v2/config/v3_1/types"
	v32 "github.com/coreos/ignition/v2/config/v3_2"
	v33 "github.com/coreos/ignition/v2/config/v3_3"
	v34 "github.com/coreos/ignition/v2/config/v3_4"
	v35 "github.com/coreos/ignition/v2/config/v3_5"

	"github.com/nodeproof/nodeproof/pemcert"
)

// DefaultVersion is the Ignition spec version openshift-install writes.
const DefaultVersion = "3.2.0"

// The Machine Config Server's ports.
const (
	// SecurePort serves Ignition over TLS.
	SecurePort = "22623"
	// PlainPort serves Ignition over plain HTTP.
	PlainPort = "22624"
)

// MaxTokenLength bounds Options.Token.
const MaxTokenLength = 4096

// Versions lists the Ignition spec versions Build can write.
func Versions() []string { return []string{"3.1.0", "3.2.0", "3.3.0", "3.4.0", "3.5.0"} }

// Options for [Build].
type Options struct {
	// URL of the pool's config on the Machine Config Server, e.g.
	// https://api-int.cluster.example.com:22623/config/worker. It must name
	// a pool (/config/<pool>) and carry no query, fragment or user info.
	URL string

	// CABundle is the PEM bundle Ignition trusts, besides the system
	// roots, for every HTTPS fetch it makes — certs.State.CABundlePEM.
	// Required for https: without it Ignition cannot verify the server.
	CABundle []byte

	// Token is the provisioning token (enhancement "mco-auth-token"); the
	// server releases the config only to holders. Anyone who can read the
	// pointer config (user data, the UPI web server) holds it too. Empty:
	// no token.
	Token string

	// TokenInURL puts the token in the URL as ?token=<token> instead of an
	// "Authorization: Bearer <token>" header. Ignition's logs print URLs
	// but not header values, so the header is the default; the query form
	// is for clients that cannot send headers.
	TokenInURL bool

	// Version is the Ignition spec version to write: one of [Versions].
	// Empty means [DefaultVersion]. Spec 3.1.0 is the oldest with
	// httpHeaders.
	Version string

	// HTTPTotal sets ignition.timeouts.httpTotal, the limit on a whole
	// fetch, rounded up to seconds. Zero leaves it out (Ignition's default:
	// no limit, retrying until the server answers).
	HTTPTotal time.Duration

	// AllowPlainHTTP permits an http:// URL (the plain port, 22624). The
	// config then travels unencrypted and unauthenticated: anyone on the
	// path can read or replace it. A token is never sent over plain HTTP,
	// and port 22623 always needs https.
	AllowPlainHTTP bool
}

// parts is what goes into a config, independent of the spec version.
type parts struct {
	version   string
	source    string
	auth      *string // Authorization header value
	caSource  *string // data URL of the CA bundle
	httpTotal *int
}

// Build returns the pointer config, as JSON without empty objects, after
// ignition's parser for that version has accepted it.
func Build(o Options) ([]byte, error) {
	p := parts{version: o.Version}
	if p.version == "" {
		p.version = DefaultVersion
	}
	parse, ok := parsers[p.version]
	if !ok {
		return nil, fmt.Errorf("pointer: Ignition spec version %q is not supported (supported: %s)", o.Version, strings.Join(Versions(), ", "))
	}

	u, err := checkURL(o)
	if err != nil {
		return nil, err
	}
	if o.Token != "" {
		if err := CheckToken(o.Token); err != nil {
			return nil, err
		}
		if o.TokenInURL {
			u.RawQuery = url.Values{"token": {o.Token}}.Encode()
		} else {
			v := "Bearer " + o.Token
			p.auth = &v
		}
	}
	p.source = u.String()

	if len(o.CABundle) > 0 {
		if err := checkBundle(o.CABundle); err != nil {
			return nil, err
		}
		v := "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString(o.CABundle)
		p.caSource = &v
	} else if u.Scheme == "https" {
		return nil, errors.New("pointer: CABundle is required for an https URL: Ignition could not verify the server's certificate")
	}

	switch {
	case o.HTTPTotal < 0:
		return nil, fmt.Errorf("pointer: HTTPTotal %s is negative", o.HTTPTotal)
	case o.HTTPTotal > 0:
		secs := int((o.HTTPTotal + time.Second - 1) / time.Second)
		p.httpTotal = &secs
	}

	raw, err := marshalCompact(build(p))
	if err != nil {
		return nil, fmt.Errorf("pointer: %w", err)
	}
	parsed, rpt, err := parse(raw)
	if err != nil {
		return nil, fmt.Errorf("pointer: Ignition %s rejects the config: %w: %s", p.version, err, rpt.String())
	}
	// What Ignition read is what was meant: nothing dropped or added.
	if again, err := marshalCompact(parsed); err != nil || !bytes.Equal(again, raw) {
		return nil, errors.New("pointer: internal error: the config does not survive a round trip through Ignition's parser")
	}
	return raw, nil
}

func checkURL(o Options) (*url.URL, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("pointer: URL: %w", err)
	}
	bad := func(why string) error { return fmt.Errorf("pointer: URL %q %s", o.URL, why) }
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, bad("must be https://")
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return nil, bad("has no host")
	case u.User != nil:
		return nil, bad("must not carry user info")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(o.URL, "#"):
		return nil, bad("must not carry a query or fragment (set Options.Token for a token)")
	case u.RawPath != "":
		return nil, bad("has escaped characters in its path")
	}
	pool, ok := strings.CutPrefix(u.Path, "/config/")
	if !ok || !validPoolName(pool) {
		return nil, bad("must name a machine config pool: /config/<pool>, e.g. /config/worker")
	}
	port := u.Port()
	switch u.Scheme {
	case "http":
		switch {
		case port == SecurePort:
			return nil, bad("uses http on port " + SecurePort + ", the Machine Config Server's TLS port: use https")
		case !o.AllowPlainHTTP:
			return nil, bad("uses plain http, which anyone on the path can read and alter: use https, or set AllowPlainHTTP")
		case o.Token != "":
			return nil, bad("uses plain http: a token is never sent in the clear")
		}
	case "https":
		if port == PlainPort {
			return nil, bad("uses https on port " + PlainPort + ", the Machine Config Server's plain-HTTP port: use " + SecurePort)
		}
	}
	return u, nil
}

// validPoolName accepts a Kubernetes object name (DNS subdomain), which
// every MachineConfigPool name is.
func validPoolName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// CheckToken accepts a provisioning token a pointer config can carry:
// printable ASCII without spaces, at most MaxTokenLength bytes, not empty.
func CheckToken(tok string) error {
	if tok == "" {
		return errors.New("pointer: empty token")
	}
	if len(tok) > MaxTokenLength {
		return fmt.Errorf("pointer: token longer than %d bytes", MaxTokenLength)
	}
	for _, r := range tok {
		if r < 0x21 || r > 0x7e {
			return errors.New("pointer: token must be printable ASCII without spaces (e.g. base64 of random bytes)")
		}
	}
	return nil
}

// checkBundle accepts only PEM certificates, at least one.
func checkBundle(b []byte) error {
	if _, err := pemcert.Parse(b); err != nil {
		return fmt.Errorf("pointer: CABundle: %w", err)
	}
	return nil
}

// marshalCompact encodes cfg without the empty objects that the Ignition
// types' omitempty leaves in ("passwd":{}, "storage":{}, ...), as
// openshift-install's pointer configs look; user data is often size-capped.
func marshalCompact(cfg any) ([]byte, error) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	if err := e.Encode(prune(v)); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// prune drops empty objects and arrays, recursively.
func prune(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			x = prune(x)
			if isEmpty(x) {
				delete(t, k)
			} else {
				t[k] = x
			}
		}
	case []any:
		for i, x := range t {
			t[i] = prune(x)
		}
		t = slices.DeleteFunc(t, isEmpty)
		return t
	}
	return v
}

func isEmpty(v any) bool {
	switch t := v.(type) {
	case map[string]any:
		return len(t) == 0
	case []any:
		return len(t) == 0
	}
	return false
}

// parsers are Ignition's parsers of the versions Build writes.
var parsers = map[string]func([]byte) (any, report.Report, error){
	"3.1.0": func(b []byte) (any, report.Report, error) { return v31.Parse(b) },
	"3.2.0": func(b []byte) (any, report.Report, error) { return v32.Parse(b) },
	"3.3.0": func(b []byte) (any, report.Report, error) { return v33.Parse(b) },
	"3.4.0": func(b []byte) (any, report.Report, error) { return v34.Parse(b) },
	"3.5.0": func(b []byte) (any, report.Report, error) { return v35.Parse(b) },
}

// build makes the config with spec 3.1's types: what a pointer config uses
// (ignition.config.merge with HTTP headers, ignition.security.tls, and
// ignition.timeouts) has the same form in every 3.x version since, so only
// the version string differs; Build then has that version's parser accept
// it.
func build(p parts) t31.Config {
	c := t31.Config{Ignition: t31.Ignition{Version: p.version}}
	r := t31.Resource{Source: &p.source}
	if p.auth != nil {
		r.HTTPHeaders = t31.HTTPHeaders{{Name: "Authorization", Value: p.auth}}
	}
	c.Ignition.Config.Merge = []t31.Resource{r}
	if p.caSource != nil {
		c.Ignition.Security.TLS.CertificateAuthorities = []t31.Resource{{Source: p.caSource}}
	}
	c.Ignition.Timeouts.HTTPTotal = p.httpTotal
	return c
}
