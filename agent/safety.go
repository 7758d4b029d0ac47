package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/safetext"
)

// ErrServerNotHTTPS is the error of a server URL that is not https:// to
// a host (CheckServerURL): the agent speaks only TLS to its server, with
// the CA bundle it was given, and never sends evidence, a kubelet key
// proof or a config token in clear.
var ErrServerNotHTTPS = errors.New("the server URL must be https://HOST[:PORT]")

// CheckServerURL checks that raw is an https URL to a host, with no user
// information, query or fragment: what the agent's --server (agent.env
// NODEPROOF_SERVER) must be. The error wraps ErrServerNotHTTPS.
func CheckServerURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %q does not parse", ErrServerNotHTTPS, safetext.Cut(raw, 256))
	case u.Scheme != "https":
		return fmt.Errorf("%w: %q is %s, and the agent speaks only TLS to its server", ErrServerNotHTTPS, safetext.Cut(raw, 256), orNone(u.Scheme))
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("%w: %q names no host", ErrServerNotHTTPS, safetext.Cut(raw, 256))
	case u.User != nil:
		return fmt.Errorf("%w: %q carries user information", ErrServerNotHTTPS, safetext.Cut(raw, 256))
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return fmt.Errorf("%w: %q carries a query or fragment", ErrServerNotHTTPS, safetext.Cut(raw, 256))
	}
	return nil
}

func orNone(scheme string) string {
	if scheme == "" {
		return "no scheme"
	}
	return "scheme " + scheme
}

// Bounds on what a refusal carries to the console and the log.
const (
	// maxRefusalBody is what the agent reads of a refusal's body.
	maxRefusalBody = 8 << 10
	// MaxRefusalDetail bounds a refusal's detail, in bytes, after its
	// control and format characters were replaced (safetext.Cut).
	MaxRefusalDetail = 2 << 10
	// maxReasonLen bounds a reason (reasons are CamelCase words).
	maxReasonLen = 64
)

// noRedirect is every agent HTTP client's CheckRedirect: the 3xx answer
// itself comes back, and once turns it into a attest.ReasonRedirected refusal.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// refusalOf makes the refusal of a non-200, non-5xx answer whose body
// (at most maxRefusalBody bytes of it) is body: a redirect is
// attest.ReasonRedirected; otherwise the body's reason, kept only when it has a
// reason's shape (attest.ReasonUnknown if not), and its detail, bounded and
// sanitized.
func refusalOf(resp *http.Response, body []byte) *Refused {
	r := &Refused{Status: resp.StatusCode}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		r.Refusal = api.Refusal{Reason: attest.ReasonRedirected, Detail: safetext.Cut(fmt.Sprintf(
			"the server answered %d, to %q; the agent follows no redirect (set the server URL to the address that serves)",
			resp.StatusCode, resp.Header.Get("Location")), MaxRefusalDetail)}
		return r
	}
	var ref api.Refusal
	if err := json.Unmarshal(body, &ref); err == nil && reasonShaped(ref.Reason) {
		r.Refusal = api.Refusal{Reason: ref.Reason, Detail: safetext.Cut(ref.Detail, MaxRefusalDetail)}
		return r
	}
	r.Refusal = api.Refusal{Reason: attest.ReasonUnknown, Detail: safetext.Cut(strings.TrimSpace(string(body)), MaxRefusalDetail)}
	return r
}

// reasonShaped reports whether r looks like a reason: 1 to 64 ASCII
// letters and digits.
func reasonShaped(r attest.Reason) bool {
	if len(r) == 0 || len(r) > maxReasonLen {
		return false
	}
	for _, c := range []byte(r) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// maxConsoleLine bounds one line the agent writes to the console.
const maxConsoleLine = 8 << 10

// console returns the agent's line writer: every line starts with
// "nodeproof-agent: ", is cleaned (safetext: whatever a server, a metadata
// service or a transport error put in it cannot move the cursor, recolour
// the console, reverse text or start a line of its own) and is bounded.
func console(out io.Writer) func(format string, args ...any) {
	return func(format string, args ...any) {
		fmt.Fprintf(out, "nodeproof-agent: %s\n", safetext.Cut(fmt.Sprintf(format, args...), maxConsoleLine))
	}
}
