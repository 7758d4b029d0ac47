package awstest

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/nodeproof/nodeproof/identity/aws"
)

// IMDSv2 headers.
const (
	TokenHeader    = "X-aws-ec2-metadata-token"
	TokenTTLHeader = "X-aws-ec2-metadata-token-ttl-seconds"
)

// IMDS is a loopback instance metadata service speaking IMDSv2 only:
//
//   - PUT /latest/api/token needs X-aws-ec2-metadata-token-ttl-seconds
//     between 1 and 21600 (400 otherwise) and refuses requests carrying
//     X-Forwarded-For (403), as EC2's does; it answers a token, valid for
//     that many seconds, and echoes the TTL header.
//   - GET of /latest/dynamic/instance-identity/{document,rsa2048,signature}
//     needs X-aws-ec2-metadata-token with a valid token (401 without it,
//     with an unknown or expired one); other paths are 404.
//
// RefuseTokens turns it into what a client trying to downgrade it would
// want: token PUTs refused, tokenless (IMDSv1) GETs served.
type IMDS struct {
	// URL is the base URL, for imds.Options.Endpoint.
	URL string

	srv *httptest.Server

	mu     sync.Mutex
	files  Files
	tokens map[string]time.Time
	gets   int
	// refuse, when not zero, answers every token PUT with this status and
	// serves GETs without a token (IMDSv1).
	refuse int
	v1Gets int
}

// NewIMDS starts an IMDS serving f. Close it when done.
func NewIMDS(f Files) *IMDS {
	m := &IMDS{files: f, tokens: make(map[string]time.Time)}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	m.URL = m.srv.URL
	return m
}

// Close stops the server.
func (m *IMDS) Close() { m.srv.Close() }

// SetFiles replaces what the service serves.
func (m *IMDS) SetFiles(f Files) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files = f
}

// Gets counts the metadata GETs answered with 200.
func (m *IMDS) Gets() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gets
}

// RefuseTokens makes the service answer every token PUT with status (403:
// as EC2 answers a PUT through a proxy or with IMDS tokens off; 404: as an
// endpoint without IMDSv2 does) and serve metadata GETs that carry no token,
// as an instance with IMDSv1 enabled does. Status 0 restores IMDSv2 only.
// A client that falls back to IMDSv1 after a refused PUT reads the
// document this way; UnauthenticatedGets counts its attempts.
func (m *IMDS) RefuseTokens(status int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refuse = status
}

// UnauthenticatedGets counts the GETs received without a token header
// (IMDSv1 requests), whatever they were answered.
func (m *IMDS) UnauthenticatedGets() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.v1Gets
}

// Client returns the node side's IMDS client (aws.NewIMDSClient: IMDSv2
// only, no IMDSv1 fallback) for this service.
func (m *IMDS) Client() *imds.Client {
	return aws.NewIMDSClient(m.URL)
}

func (m *IMDS) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/latest/api/token" {
		m.token(w, r)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	tok := r.Header.Get(TokenHeader)
	if tok == "" {
		m.v1Gets++
	}
	exp, ok := m.tokens[tok]
	v1 := tok == "" && m.refuse != 0
	if !v1 && (!ok || !time.Now().Before(exp)) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	var body []byte
	switch r.URL.Path {
	case "/latest/dynamic/instance-identity/document":
		body = m.files.Document
	case "/latest/dynamic/instance-identity/rsa2048":
		body = []byte(m.files.RSA2048)
	case "/latest/dynamic/instance-identity/signature":
		body = []byte(m.files.Signature)
	}
	if body == nil {
		http.NotFound(w, r)
		return
	}
	m.gets++
	w.Header().Set("Content-Type", "text/plain")
	w.Write(body)
}

func (m *IMDS) token(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	m.mu.Lock()
	refuse := m.refuse
	m.mu.Unlock()
	if refuse != 0 {
		http.Error(w, http.StatusText(refuse), refuse)
		return
	}
	ttl, err := strconv.Atoi(r.Header.Get(TokenTTLHeader))
	if err != nil || ttl < 1 || ttl > 21600 {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	b := make([]byte, 32)
	rand.Read(b)
	tok := base64.StdEncoding.EncodeToString(b)
	m.mu.Lock()
	m.tokens[tok] = time.Now().Add(time.Duration(ttl) * time.Second)
	m.mu.Unlock()
	w.Header().Set(TokenTTLHeader, strconv.Itoa(ttl))
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte(tok))
}
