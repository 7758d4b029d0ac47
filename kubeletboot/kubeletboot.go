// Package kubeletboot does what the kubelet's TLS bootstrap does
// (k8s.io/kubernetes pkg/kubelet/certificate/bootstrap.LoadClientCert),
// with the key the agent bound into its evidence, before the kubelet
// runs: it reads the bootstrap kubeconfig, submits the kubelet's client
// CSR (signer kubernetes.io/kube-apiserver-client-kubelet, CN
// system:node:NODE, O system:nodes, usages digital signature and client
// auth) with the bootstrap token, waits for the issued certificate, and
// writes what the kubelet reads: the certificate and key as client-go's
// certificate FileStore lays them out (kubelet-client-<time>.pem and the
// symlink kubelet-client-current.pem) and the kubeconfig pointing at it.
// A kubelet that rotates its certificates then finds a valid one and
// never makes a bootstrap CSR with a key of its own.
//
// It speaks the certificates.k8s.io/v1 REST API with net/http, not
// client-go: the agent that links it goes into an initramfs
// (cmd/nodeproof-agent/agentcli's TestAgentImportsNoServerCode).
package kubeletboot

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Kubernetes names the CSR uses.
const (
	SignerKubeletClient = "kubernetes.io/kube-apiserver-client-kubelet"
	csrPath             = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
	// maxBody bounds what the agent reads of the API server's answers and
	// of the kubeconfig.
	maxBody = 1 << 20
)

// Kubeconfig is what the bootstrap kubeconfig gives: the API server, the
// CAs its certificate chains to, and the bootstrap token.
type Kubeconfig struct {
	Server string
	CA     []byte // PEM
	Token  string
}

type kubeconfigFile struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server   string `yaml:"server"`
			CAData   string `yaml:"certificate-authority-data"`
			CAFile   string `yaml:"certificate-authority"`
			Insecure bool   `yaml:"insecure-skip-tls-verify"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			Token     string `yaml:"token"`
			TokenFile string `yaml:"tokenFile"`
		} `yaml:"user"`
	} `yaml:"users"`
}

// ParseKubeconfig reads a bootstrap kubeconfig: its current context's (or,
// with none named, its only) cluster and user. The cluster must be https
// with a CA (inline, or a file read relative to dir), the user a token
// (inline or tokenFile); insecure-skip-tls-verify is refused.
func ParseKubeconfig(b []byte, dir string) (Kubeconfig, error) {
	var f kubeconfigFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		return Kubeconfig{}, fmt.Errorf("kubeconfig: %w", err)
	}
	clusterName, userName := "", ""
	switch {
	case f.CurrentContext != "":
		found := false
		for _, c := range f.Contexts {
			if c.Name == f.CurrentContext {
				clusterName, userName, found = c.Context.Cluster, c.Context.User, true
			}
		}
		if !found {
			return Kubeconfig{}, fmt.Errorf("kubeconfig: no context %q", f.CurrentContext)
		}
	case len(f.Clusters) == 1 && len(f.Users) == 1:
		clusterName, userName = f.Clusters[0].Name, f.Users[0].Name
	default:
		return Kubeconfig{}, errors.New("kubeconfig: no current-context and not one cluster and one user")
	}
	var k Kubeconfig
	foundCluster, foundUser := false, false
	for _, c := range f.Clusters {
		if c.Name != clusterName {
			continue
		}
		foundCluster = true
		if c.Cluster.Insecure {
			return Kubeconfig{}, errors.New("kubeconfig: insecure-skip-tls-verify is not followed")
		}
		u, err := url.Parse(c.Cluster.Server)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return Kubeconfig{}, fmt.Errorf("kubeconfig: server %q is not an https URL", c.Cluster.Server)
		}
		k.Server = strings.TrimSuffix(c.Cluster.Server, "/")
		switch {
		case c.Cluster.CAData != "":
			ca, err := base64.StdEncoding.DecodeString(c.Cluster.CAData)
			if err != nil {
				return Kubeconfig{}, fmt.Errorf("kubeconfig: certificate-authority-data: %w", err)
			}
			k.CA = ca
		case c.Cluster.CAFile != "":
			ca, err := readMax(resolve(dir, c.Cluster.CAFile))
			if err != nil {
				return Kubeconfig{}, fmt.Errorf("kubeconfig: certificate-authority: %w", err)
			}
			k.CA = ca
		default:
			return Kubeconfig{}, errors.New("kubeconfig: the cluster names no certificate authority")
		}
	}
	for _, u := range f.Users {
		if u.Name != userName {
			continue
		}
		foundUser = true
		switch {
		case u.User.Token != "":
			k.Token = u.User.Token
		case u.User.TokenFile != "":
			t, err := readMax(resolve(dir, u.User.TokenFile))
			if err != nil {
				return Kubeconfig{}, fmt.Errorf("kubeconfig: tokenFile: %w", err)
			}
			k.Token = strings.TrimSpace(string(t))
		}
	}
	switch {
	case !foundCluster:
		return Kubeconfig{}, fmt.Errorf("kubeconfig: no cluster %q", clusterName)
	case !foundUser:
		return Kubeconfig{}, fmt.Errorf("kubeconfig: no user %q", userName)
	case k.Token == "":
		return Kubeconfig{}, fmt.Errorf("kubeconfig: user %q has no token (a bootstrap kubeconfig carries one)", userName)
	}
	return k, nil
}

func resolve(dir, p string) string {
	if filepath.IsAbs(p) || dir == "" {
		return p
	}
	return filepath.Join(dir, p)
}

func readMax(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxBody+1))
	if err == nil && len(b) > maxBody {
		err = fmt.Errorf("%s is over %d bytes", path, maxBody)
	}
	return b, err
}

// MakeCSR is the kubelet's client CSR for node, signed by key: CN
// system:node:NODE, O system:nodes, no SANs (as the kubelet's
// certificate manager makes it), PEM.
func MakeCSR(key crypto.Signer, node string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
	}, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// Client submits and reads CSRs as the bootstrap kubeconfig's user.
type Client struct {
	server string
	token  string
	http   *http.Client
}

// NewClient is a client of k's API server, trusting only k.CA.
func NewClient(k Kubeconfig) (*Client, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(k.CA) {
		return nil, errors.New("kubeconfig: the certificate authority holds no PEM certificate")
	}
	return &Client{server: k.Server, token: k.Token, http: &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: 10 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// CSR is what the agent reads of a CertificateSigningRequest.
type CSR struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Request    []byte   `json:"request"`
		SignerName string   `json:"signerName"`
		Usages     []string `json:"usages"`
	} `json:"spec"`
	Status struct {
		Conditions []Condition `json:"conditions"`
		// Certificate is the issued certificate (PEM, the leaf first).
		Certificate []byte `json:"certificate"`
	} `json:"status"`
}

// Condition is one of a CSR's conditions.
type Condition struct {
	Type    string `json:"type"` // Approved, Denied, Failed
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Decision is the CSR's Approved, Denied or Failed condition; ok false
// when it has none yet.
func (c *CSR) Decision() (Condition, bool) {
	for _, cond := range c.Status.Conditions {
		switch cond.Type {
		case "Approved", "Denied", "Failed":
			return cond, true
		}
	}
	return Condition{}, false
}

// ErrRefused is an answer of the API server that retrying does not change
// (a 4xx other than 409 and 429), or a CSR denied or failed.
var ErrRefused = errors.New("refused")

// Name is the CSR's name for the request csrPEM: derived from its public
// key and subject, so that submitting it again (after an answer lost on
// the network) finds the same CSR (as the kubelet's bootstrap names its
// CSRs: node-csr-…).
func Name(csrPEM []byte) (string, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil {
		return "", errors.New("the CSR is not PEM")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(req.RawSubjectPublicKeyInfo)
	h.Write(req.RawSubject)
	return "node-csr-" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))[:32], nil
}

// Submit creates the CSR for csrPEM (usages digital signature and client
// auth, SignerKubeletClient) and returns its name. A CSR of that name
// already there (submitted before) is taken when it carries the same
// request, refused otherwise.
func (c *Client) Submit(ctx context.Context, csrPEM []byte) (string, error) {
	name, err := Name(csrPEM)
	if err != nil {
		return "", err
	}
	obj := map[string]any{
		"apiVersion": "certificates.k8s.io/v1",
		"kind":       "CertificateSigningRequest",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"request":    csrPEM,
			"signerName": SignerKubeletClient,
			"usages":     []string{"digital signature", "client auth"},
		},
	}
	body, err := json.Marshal(obj)
	if err != nil {
		return "", err
	}
	status, _, err := c.do(ctx, http.MethodPost, csrPath, body)
	switch {
	case err != nil:
		return "", err
	case status == http.StatusConflict:
		got, err := c.Get(ctx, name)
		if err != nil {
			return "", err
		}
		if !bytes.Equal(bytes.TrimSpace(got.Spec.Request), bytes.TrimSpace(csrPEM)) {
			// The same key and subject, another request: a CSR submitted
			// by an earlier run; it is as good.
			if !samePublicKey(got.Spec.Request, csrPEM) {
				return "", fmt.Errorf("CSR %s exists with another key: %w", name, ErrRefused)
			}
		}
		return name, nil
	}
	return name, nil
}

func samePublicKey(a, b []byte) bool {
	pa, pb := spki(a), spki(b)
	return pa != nil && bytes.Equal(pa, pb)
}

func spki(csrPEM []byte) []byte {
	block, _ := pem.Decode(csrPEM)
	if block == nil {
		return nil
	}
	r, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil
	}
	return r.RawSubjectPublicKeyInfo
}

// Get reads the CSR name.
func (c *Client) Get(ctx context.Context, name string) (*CSR, error) {
	_, body, err := c.do(ctx, http.MethodGet, csrPath+"/"+url.PathEscape(name), nil)
	if err != nil {
		return nil, err
	}
	var csr CSR
	if err := json.Unmarshal(body, &csr); err != nil {
		return nil, fmt.Errorf("CSR %s: %w", name, err)
	}
	return &csr, nil
}

// Wait polls the CSR name every interval until it is decided (issued
// true: approved and its certificate issued), and returns it. Network
// errors and 5xx answers are retried until ctx ends; Denied and Failed
// are ErrRefused.
func (c *Client) Wait(ctx context.Context, name string, issued bool, interval time.Duration) (*CSR, error) {
	var last error
	for {
		csr, err := c.Get(ctx, name)
		switch {
		case errors.Is(err, ErrRefused):
			return nil, err
		case err != nil:
			last = err
		default:
			if cond, ok := csr.Decision(); ok {
				switch {
				case cond.Type != "Approved":
					return csr, fmt.Errorf("CSR %s %s (%s: %s): %w", name, cond.Type, cond.Reason, oneLine(cond.Message), ErrRefused)
				case !issued || len(csr.Status.Certificate) > 0:
					return csr, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return nil, fmt.Errorf("CSR %s: %w (last error: %v)", name, ctx.Err(), last)
			}
			return nil, fmt.Errorf("CSR %s not issued: %w", name, ctx.Err())
		case <-time.After(interval):
		}
	}
}

// do sends one request; a 4xx other than 409 is ErrRefused, a 409 is
// returned as its status, anything else not 2xx an error to retry.
func (c *Client) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, err
	}
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300, s == http.StatusConflict:
		return s, b, nil
	case s >= 400 && s < 500 && s != http.StatusTooManyRequests:
		return s, nil, fmt.Errorf("%s %s: HTTP %d: %s: %w", method, path, s, apiMessage(b), ErrRefused)
	default:
		return s, nil, fmt.Errorf("%s %s: HTTP %d: %s", method, path, s, apiMessage(b))
	}
}

// apiMessage is a Status's message, else the start of the body.
func apiMessage(b []byte) string {
	var st struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &st) == nil && st.Message != "" {
		return oneLine(st.Message)
	}
	if len(b) > 200 {
		b = b[:200]
	}
	return oneLine(string(b))
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
