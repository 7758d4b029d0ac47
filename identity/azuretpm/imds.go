package azuretpm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// DefaultIMDSEndpoint is Azure's Instance Metadata Service.
const DefaultIMDSEndpoint = "http://169.254.169.254"

// IMDSAPIVersion is the attested document API version asked for.
const IMDSAPIVersion = "2020-09-01"

// IMDS fetches attested documents from Azure's Instance Metadata Service:
// GET /metadata/attested/document?api-version=…&nonce=… with the header
// "Metadata: true", answered by {"encoding":"pkcs7","signature":"…"}. It
// uses no proxy (IMDS refuses proxied requests), follows no redirect, and
// bounds the time and the size of the answer.
type IMDS struct {
	// Endpoint is the service's base URL; "" means DefaultIMDSEndpoint.
	Endpoint string
	// Timeout bounds one request; zero means 10 seconds.
	Timeout time.Duration
}

// maxIMDSResponse bounds IMDS's answer: the document and its envelope.
const maxIMDSResponse = MaxDocumentSize + 1<<10

// AttestedDocument asks IMDS for the attested document with nonce (1-32
// alphanumerics) and returns its signature field as IMDS sent it.
func (m *IMDS) AttestedDocument(ctx context.Context, nonce string) (string, error) {
	if !nonceRE.MatchString(nonce) {
		return "", fmt.Errorf("azuretpm: IMDS nonce %q is not 1-32 alphanumerics", nonce)
	}
	base := m.Endpoint
	if base == "" {
		base = DefaultIMDSEndpoint
	}
	timeout := m.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("azuretpm: IMDS endpoint: %w", err)
	}
	u = u.JoinPath("metadata", "attested", "document")
	u.RawQuery = url.Values{"api-version": {IMDSAPIVersion}, "nonce": {nonce}}.Encode()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("azuretpm: IMDS request: %w", err)
	}
	req.Header.Set("Metadata", "true")
	client := &http.Client{
		Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: timeout}).DialContext, ResponseHeaderTimeout: timeout},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("IMDS redirected")
		},
	}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("azuretpm: IMDS attested document: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxIMDSResponse+1))
	if err != nil {
		return "", fmt.Errorf("azuretpm: IMDS attested document: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("azuretpm: IMDS attested document: %s", resp.Status)
	}
	if len(body) > maxIMDSResponse {
		return "", fmt.Errorf("azuretpm: IMDS attested document exceeds %d bytes", maxIMDSResponse)
	}
	var doc struct {
		Encoding  string `json:"encoding"`
		Signature string `json:"signature"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", fmt.Errorf("azuretpm: IMDS attested document: %w", err)
	}
	if doc.Encoding != "pkcs7" || doc.Signature == "" {
		return "", fmt.Errorf("azuretpm: IMDS attested document of encoding %q, want pkcs7", doc.Encoding)
	}
	return doc.Signature, nil
}
