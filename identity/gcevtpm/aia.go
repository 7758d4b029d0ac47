package gcevtpm

import (
	"bytes"
	"container/list"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"
)

// DefaultAIAHosts are where Google publishes its vTPM intermediates, as
// the certificates' Authority Information Access names them: pki.goog for
// the tpm_ek_v1_cloud_host chain and the Certificate Authority Service
// bucket of the EK/AK CA chain (certs/sources.txt). Exact hosts: a pattern
// such as privateca-content-*.storage.googleapis.com would match any
// customer's bucket, whose owner could then serve what the server caches.
var DefaultAIAHosts = []string{"pki.goog", "privateca-content-633beb94-0000-25c1-a9d7-001a114ba6e8.storage.googleapis.com"}

// AIA fetches a certificate's issuer from the URL its Authority
// Information Access extension names, for an AK certificate whose issuer
// is neither shipped nor sent by the node. Nothing is fetched unless the
// operator configures one (Options.AIA nil: never). What is fetched only
// helps build a chain: trust still ends at a pinned root, so a hostile
// server can make verification fail, never succeed. The node chooses the
// URLs, so every fetch is bounded:
//   - only http and https URLs whose host is one of AllowedHosts, exactly
//     (no patterns: a wildcard into a shared namespace such as Cloud
//     Storage's is anyone's; empty is refused when the AIA is made);
//   - at most MaxURLs URLs per certificate, MaxHops issuers per chain;
//   - each response within Timeout and MaxBytes, no redirects;
//   - a fetched certificate is kept only if it signed the certificate
//     that named it; kept ones are cached by URL, the maxCached most
//     recently used (least recently used evicted), so a fleet costs one
//     fetch per intermediate, not one per machine, and no stream of
//     requests fills the cache for good.
type AIA struct {
	// Client does the requests; nil: an http.Client with Timeout and no
	// redirects. A Client given here is used as it is, except that
	// redirects are refused.
	Client *http.Client
	// AllowedHosts are the hosts fetched from, exact names (compared
	// without regard to case). DefaultAIAHosts are Google's.
	AllowedHosts []string
	// MaxBytes bounds a response; zero means 64 KiB.
	MaxBytes int64
	// Timeout bounds one request; zero means 10 s.
	Timeout time.Duration
	// MaxHops bounds the issuers fetched for one chain; zero means 3.
	MaxHops int
	// MaxURLs bounds the URLs tried per certificate; zero means 3.
	MaxURLs int

	mu    sync.Mutex
	cache map[string]*list.Element // of *cached; order: most recent first
	order list.List
}

// cached is one certificate the cache keeps, by the URL it came from.
type cached struct {
	url  string
	cert *x509.Certificate
}

// maxCached bounds the cache.
const maxCached = 64

func (a *AIA) check() error {
	if len(a.AllowedHosts) == 0 {
		return errors.New("gcevtpm: AIA.AllowedHosts is empty: name the hosts issuers may be fetched from (DefaultAIAHosts)")
	}
	for _, h := range a.AllowedHosts {
		if !hostName.MatchString(h) {
			return fmt.Errorf("gcevtpm: AIA.AllowedHosts %q is not an exact host name (no patterns: a wildcard such as privateca-content-*.storage.googleapis.com matches any customer's bucket; name each host)", h)
		}
	}
	if a.MaxBytes < 0 || a.Timeout < 0 || a.MaxHops < 0 || a.MaxURLs < 0 {
		return errors.New("gcevtpm: AIA bounds must not be negative")
	}
	return nil
}

func (a *AIA) maxBytes() int64 {
	if a.MaxBytes == 0 {
		return 64 << 10
	}
	return a.MaxBytes
}

func (a *AIA) timeout() time.Duration {
	if a.Timeout == 0 {
		return 10 * time.Second
	}
	return a.Timeout
}

func (a *AIA) maxHops() int {
	if a.MaxHops == 0 {
		return 3
	}
	return a.MaxHops
}

func (a *AIA) maxURLs() int {
	if a.MaxURLs == 0 {
		return 3
	}
	return a.MaxURLs
}

func (a *AIA) client() *http.Client {
	c := http.Client{Timeout: a.timeout()}
	if a.Client != nil {
		c = *a.Client
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

// allowed reports whether u may be fetched.
func (a *AIA) allowed(u *url.URL) bool {
	if u.Scheme != "http" && u.Scheme != "https" || u.User != nil {
		return false
	}
	for _, h := range a.AllowedHosts {
		if strings.EqualFold(h, u.Hostname()) {
			return true
		}
	}
	return false
}

// hostName is a DNS name or an IPv4 address: labels of letters, digits
// and hyphens.
var hostName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// cacheGet returns the certificate cached for url, making it the most
// recently used.
func (a *AIA) cacheGet(url string) (*x509.Certificate, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.cache[url]
	if !ok {
		return nil, false
	}
	a.order.MoveToFront(e)
	return e.Value.(*cached).cert, true
}

// cachePut keeps c for url, evicting the least recently used beyond
// maxCached.
func (a *AIA) cachePut(url string, c *x509.Certificate) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cache == nil {
		a.cache = map[string]*list.Element{}
	}
	if e, ok := a.cache[url]; ok {
		e.Value.(*cached).cert = c
		a.order.MoveToFront(e)
		return
	}
	a.cache[url] = a.order.PushFront(&cached{url: url, cert: c})
	for a.order.Len() > maxCached {
		last := a.order.Back()
		a.order.Remove(last)
		delete(a.cache, last.Value.(*cached).url)
	}
}

// CacheLen is how many issuers the cache holds (for tests and metrics).
func (a *AIA) CacheLen() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.order.Len()
}

// Issuers walks up from cert: for each certificate whose issuer is not in
// known, it fetches the issuer from that certificate's AIA URLs, keeps it
// if it signed the certificate, and goes on from it, until a certificate's
// issuer is known or has no URL, or MaxHops issuers were fetched. It
// returns what it fetched (and what the cache held), and the last error
// if it fetched nothing it could use.
func (a *AIA) Issuers(ctx context.Context, cert *x509.Certificate, known []*x509.Certificate) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	var lastErr error
	cur := cert
	for hop := 0; hop < a.maxHops(); hop++ {
		if issuedByAny(cur, known) || issuedByAny(cur, out) || bytes.Equal(cur.RawIssuer, cur.RawSubject) {
			return out, nil
		}
		parent, err := a.issuer(ctx, cur)
		if err != nil {
			lastErr = err
			break
		}
		if parent == nil {
			break
		}
		out = append(out, parent)
		cur = parent
	}
	if len(out) == 0 && lastErr != nil {
		return nil, lastErr
	}
	return out, nil
}

// issuer fetches cert's issuer from its first usable AIA URL; nil, nil
// when it names none that is allowed.
func (a *AIA) issuer(ctx context.Context, cert *x509.Certificate) (*x509.Certificate, error) {
	var lastErr error
	tried := 0
	for _, raw := range cert.IssuingCertificateURL {
		if tried >= a.maxURLs() {
			break
		}
		u, err := url.Parse(raw)
		if err != nil || !a.allowed(u) {
			lastErr = fmt.Errorf("AIA URL %q is not an allowed http(s) host", raw)
			continue
		}
		tried++
		c, hit := a.cacheGet(raw)
		if hit && cert.CheckSignatureFrom(c) == nil {
			return c, nil
		}
		c, err = a.fetch(ctx, raw)
		if err != nil {
			lastErr = err
			continue
		}
		if err := cert.CheckSignatureFrom(c); err != nil {
			lastErr = fmt.Errorf("the certificate at %s did not sign %q: %w", raw, cert.Subject, err)
			continue
		}
		a.cachePut(raw, c)
		return c, nil
	}
	return nil, lastErr
}

// Fetch fetches one certificate from raw within the AIA's bounds (an
// allowed http or https host, Timeout, MaxBytes, no redirect): for
// hack/gcevtpm-intermediates, which refreshes the shipped intermediates.
func (a *AIA) Fetch(ctx context.Context, raw string) (*x509.Certificate, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	u, err := url.Parse(raw)
	if err != nil || !a.allowed(u) {
		return nil, fmt.Errorf("%q is not an allowed http(s) URL", raw)
	}
	return a.fetch(ctx, raw)
}

func (a *AIA) fetch(ctx context.Context, raw string) (*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", raw, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch %s: status %d", raw, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, a.maxBytes()+1))
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", raw, err)
	}
	if int64(len(body)) > a.maxBytes() {
		return nil, fmt.Errorf("fetch %s: more than %d bytes", raw, a.maxBytes())
	}
	return parseOneCert(body)
}

// parseOneCert reads one certificate, DER (as AIA serves them) or PEM.
func parseOneCert(b []byte) (*x509.Certificate, error) {
	if blk, rest := pem.Decode(b); blk != nil && blk.Type == "CERTIFICATE" && len(bytes.TrimSpace(rest)) == 0 {
		b = blk.Bytes
	}
	return x509.ParseCertificate(b)
}

// issuedByAny reports whether one of certs has c's issuer name and signed
// it.
func issuedByAny(c *x509.Certificate, certs []*x509.Certificate) bool {
	for _, p := range certs {
		if bytes.Equal(p.RawSubject, c.RawIssuer) && c.CheckSignatureFrom(p) == nil {
			return true
		}
	}
	return false
}
