// Package agent is the node side of nodeproof over the network: it runs
// challenge → verify against the server with the node's evidence and hands
// back the config token. It imports no server code and no client-go, so
// the initramfs binary stays small.
//
// Retries follow Ignition's rules: a 5xx (or no answer) means "not yet",
// retried with backoff until the context ends; a 4xx is final and comes
// back as a *Refused carrying the server's reason.
//
// A sealed session lives a few minutes. Verify is retried with the same
// session on 5xx and transport errors (the server answers a repeated verify
// of a session whose record it already wrote with that record's config
// token), so a lost answer costs nothing. If the server stayed unavailable
// until the session expired, the retry is refused SessionExpired: then, and
// only then, the agent starts over from the challenge, at most
// Client.Restarts times.
package agent

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/safetext"
)

// Refused is a final refusal from the server.
type Refused struct {
	Status  int
	Refusal api.Refusal
}

func (r *Refused) Error() string {
	return fmt.Sprintf("server refused (%d %s): %s", r.Status, r.Refusal.Reason, r.Refusal.Detail)
}

// maxResponse bounds what the agent reads of a 200 answer (a full config
// is typically 0.5–2 MB); a refusal's body is read to maxRefusalBody.
const maxResponse = 64 << 20

// maxRetryAfter bounds the wait a Retry-After may ask for: a proxy or a
// server asking for days (or for more seconds than a time.Duration holds)
// must not park the node.
const maxRetryAfter = 10 * time.Minute

// Client talks to one server.
type Client struct {
	// BaseURL is https://host:22623.
	BaseURL string
	HTTP    *http.Client
	// Backoff bounds the wait between retries (defaults: 1s doubling to
	// 30s).
	MinBackoff, MaxBackoff time.Duration
	// Progress, if set, is told about each retry (for the console).
	Progress func(format string, args ...any)
	// Sleep waits; tests replace it. Default: a timer that ends with ctx.
	Sleep func(ctx context.Context, d time.Duration) error
	// Restarts bounds how often one attestation starts over from the
	// challenge because its session expired while verify was being
	// retried, and how often AttestAndFetch attests again because its
	// config token was spent by a delivery that never arrived (0:
	// DefaultRestarts; negative: never).
	Restarts int
	// KubeletKey, if set, is the kubelet's private key: every verify then
	// carries a proof that this node holds it (attest.SignKeyProof), which
	// lets an AWS instance enrol again after a crash cost it its config
	// token. Its public key must be the one the evidence binds.
	KubeletKey crypto.Signer
	// Challenges counts the attestations this client has started (each a
	// new challenge): more than one means a session expired or a config
	// token was spent by a delivery that never arrived.
	Challenges int
	// Purpose, if set, is what every attestation is for (the challenge's
	// purpose): attest.PurposeReattest for a node that enrolled.
	Purpose attest.Purpose

	// session is the last challenge's sealed session: a failure report
	// carries it (with a kubelet key proof) to be authenticated.
	session string
}

// DefaultRestarts is Client.Restarts when unset.
const DefaultRestarts = 3

// NewClient returns a client for the server at baseURL (https only:
// CheckServerURL) that trusts exactly caBundle (PEM), uses no proxy and
// follows no redirect.
func NewClient(baseURL string, caBundle []byte) (*Client, error) {
	if err := CheckServerURL(baseURL); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caBundle) {
		return nil, errors.New("agent: CA bundle holds no certificate")
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), HTTP: &http.Client{Transport: tr, Timeout: time.Minute, CheckRedirect: noRedirect}}, nil
}

// TPM is what AttestTPM needs of a TPM: *tpm.Collector (a real TPM or
// swtpm), or a software model for load tests.
type TPM interface {
	Request() (*tpm.ChallengeRequest, error)
	Answer(ch *tpm.Challenge, kubeletKeySHA256 []byte) (*tpm.Evidence, error)
}

var _ TPM = (*tpm.Collector)(nil)

// AttestTPM runs both steps with a TPM and returns the server's answer
// with the config token.
func (c *Client) AttestTPM(ctx context.Context, pool, nodeName string, coll TPM, kubeletPKIX []byte) (*api.VerifyResponse, error) {
	return c.AttestTPMTicketed(ctx, pool, nodeName, coll, kubeletPKIX, "")
}

// AttestTPMTicketed is AttestTPM sending ticket, the server's AK ticket
// for the collector's kept AK ("" none): when it holds, the server's
// challenge carries no credential to activate.
func (c *Client) AttestTPMTicketed(ctx context.Context, pool, nodeName string, coll TPM, kubeletPKIX []byte, ticket string) (*api.VerifyResponse, error) {
	keySHA, err := attest.KeySHA256(kubeletPKIX)
	if err != nil {
		return nil, err
	}
	return c.attest(ctx, func() (*api.ChallengeRequest, error) {
		req, err := coll.Request()
		if err != nil {
			return nil, fmt.Errorf("read TPM identity: %w", err)
		}
		env := challengeRequest(attest.KindTPM, pool, nodeName, kubeletPKIX, req)
		env.Ticket = ticket
		return env, nil
	}, func(ch *api.ChallengeResponse) (*api.VerifyRequest, error) {
		tc, err := challengeOf[tpm.Challenge](ch, attest.KindTPM)
		if err != nil {
			return nil, err
		}
		ev, err := coll.Answer(tc, keySHA)
		if err != nil {
			return nil, fmt.Errorf("answer the challenge with the TPM: %w", err)
		}
		return verifyRequest(attest.KindTPM, ch, ev), nil
	})
}

// challengeRequest is a kind's challenge request in its envelope.
func challengeRequest(kind attest.Kind, pool, nodeName string, kubeletPKIX []byte, req any) *api.ChallengeRequest {
	return &api.ChallengeRequest{Kind: kind, Pool: pool, KubeletPublicKey: kubeletPKIX, NodeName: nodeName, Request: api.Message(req)}
}

// verifyRequest is a kind's evidence in its envelope, answering ch.
func verifyRequest(kind attest.Kind, ch *api.ChallengeResponse, ev any) *api.VerifyRequest {
	return &api.VerifyRequest{Session: ch.Session, Kind: kind, Evidence: api.Message(ev)}
}

// challengeOf decodes ch's challenge of kind (a server that names another
// kind, or sends none, is an error).
func challengeOf[T any](ch *api.ChallengeResponse, kind attest.Kind) (*T, error) {
	if ch.Kind != kind || len(ch.Challenge) == 0 {
		return nil, fmt.Errorf("server sent no %s challenge", kind)
	}
	var c T
	if err := json.Unmarshal(ch.Challenge, &c); err != nil {
		return nil, fmt.Errorf("the server's %s challenge: %w", kind, err)
	}
	return &c, nil
}

// attest runs challenge → answer → verify. Verify is retried with the
// same session while the server says "not yet" or does not answer; when
// such a retry is refused SessionExpired, the whole exchange starts over
// from a new challenge (at most Restarts times). A SessionExpired on
// verify's first try (the node's answer took too long, or the clocks
// disagree) and every other refusal are final.
func (c *Client) attest(ctx context.Context, request func() (*api.ChallengeRequest, error), answer func(*api.ChallengeResponse) (*api.VerifyRequest, error)) (*api.VerifyResponse, error) {
	restarts := c.Restarts
	if restarts == 0 {
		restarts = DefaultRestarts
	}
	for n := 0; ; n++ {
		c.Challenges++
		req, err := request()
		if err != nil {
			return nil, err
		}
		req.Purpose = c.Purpose
		if _, err := attest.KeySHA256(req.KubeletPublicKey); err != nil {
			return nil, err
		}
		var ch api.ChallengeResponse
		if _, err := c.post(ctx, api.PathChallenge, req, &ch); err != nil {
			return nil, err
		}
		c.session = ch.Session
		vreq, err := answer(&ch)
		if err != nil {
			return nil, err
		}
		if c.KubeletKey != nil {
			if err := c.prove(req.KubeletPublicKey, vreq); err != nil {
				return nil, err
			}
		}
		var vr api.VerifyResponse
		attempts, err := c.post(ctx, api.PathVerify, vreq, &vr)
		if err == nil {
			return &vr, nil
		}
		var r *Refused
		if !errors.As(err, &r) || r.Refusal.Reason != attest.ReasonSessionExpired || attempts < 2 || n >= restarts {
			return nil, err
		}
		c.progress("%s: the session expired while the server was not answering (%d attempts); starting over from the challenge (restart %d of %d)",
			api.PathVerify, attempts, n+1, restarts)
	}
}

// prove adds the kubelet key proof to vreq.
func (c *Client) prove(bound []byte, vreq *api.VerifyRequest) error {
	mine, err := x509.MarshalPKIXPublicKey(c.KubeletKey.Public())
	if err != nil {
		return fmt.Errorf("agent: kubelet key: %w", err)
	}
	if !bytes.Equal(mine, bound) {
		return errors.New("agent: the kubelet key is not the one the evidence binds")
	}
	vreq.KubeletKeyProof, err = attest.SignKeyProof(c.KubeletKey, vreq.Session)
	return err
}

// AttestAndFetch attests with ev and fetches the full config with the
// config token. A config token is spent by the delivery that used it; if
// the server died while sending the config, the retry finds the token
// spent (TokenAlreadyUsed) and the node attests again for a new token, at
// most Restarts times. (Go's transport itself retries a GET whose reused
// connection was reset, so a spent token can come back on what looks
// like the first try; the token is this node's alone, so the refusal
// always means a delivery of it failed or was stolen, and attesting again
// is right either way.) Any other refusal is final.
func (c *Client) AttestAndFetch(ctx context.Context, ev Evidence, pool, nodeName string, kubeletPKIX []byte) (*api.VerifyResponse, []byte, error) {
	restarts := c.Restarts
	if restarts == 0 {
		restarts = DefaultRestarts
	}
	for n := 0; ; n++ {
		vr, err := ev.Attest(ctx, c, pool, nodeName, kubeletPKIX)
		if err != nil {
			return nil, nil, err
		}
		full, err := c.FetchConfig(ctx, vr.Pool, vr.ConfigToken)
		if err == nil {
			return vr, full, nil
		}
		var r *Refused
		if !errors.As(err, &r) || r.Refusal.Reason != attest.ReasonTokenUsed || n >= restarts {
			return vr, nil, err
		}
		c.progress("%s: the config token was spent by a delivery that did not arrive here; attesting again (%d of %d)",
			api.PathConfig+pool, n+1, restarts)
	}
}

// FetchConfig gets the full config of pool with a config token (GET
// /config/<pool>, Authorization: Bearer, Accept as Ignition v2.24 sends
// it), retrying while the server says "not yet". A config token is single
// use: a second fetch with it is refused.
func (c *Client) FetchConfig(ctx context.Context, pool, token string) ([]byte, error) {
	var raw json.RawMessage
	_, err := c.retry(ctx, api.PathConfig+pool, func() (time.Duration, error) {
		return c.once(ctx, http.MethodGet, api.PathConfig+pool, nil, map[string]string{
			"Authorization": "Bearer " + token, "Accept": api.IgnitionAccept,
		}, &raw)
	})
	return raw, err
}

// post sends v and decodes the answer into out, retrying while the server
// says "not yet"; it returns how many requests it made.
func (c *Client) post(ctx context.Context, path string, v, out any) (int, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return 0, err
	}
	return c.retry(ctx, path, func() (time.Duration, error) {
		return c.once(ctx, http.MethodPost, path, body, map[string]string{"Content-Type": "application/json"}, out)
	})
}

// retry runs try until it succeeds, is refused (4xx, a redirect), has no
// https server to ask (ErrServerNotHTTPS) or ctx ends, waiting
// between attempts as the server asked (Retry-After, up to maxRetryAfter,
// honoured even above MaxBackoff) or with backoff (MinBackoff doubling to
// MaxBackoff), and returns the number of attempts made.
func (c *Client) retry(ctx context.Context, path string, try func() (time.Duration, error)) (int, error) {
	backoff := c.MinBackoff
	if backoff == 0 {
		backoff = time.Second
	}
	maxBackoff := c.MaxBackoff
	if maxBackoff == 0 {
		maxBackoff = 30 * time.Second
	}
	for attempt := 1; ; attempt++ {
		wait, err := try()
		if err == nil {
			return attempt, nil
		}
		var refused *Refused
		if errors.As(err, &refused) || errors.Is(err, ErrServerNotHTTPS) {
			return attempt, err
		}
		if ctx.Err() != nil {
			return attempt, fmt.Errorf("%s: gave up (%w); last error: %w", path, ctx.Err(), err)
		}
		if wait < backoff {
			wait = backoff
		}
		// A wait past the agent's own deadline would end in a bare
		// "context deadline exceeded": say it now, with the server's reason.
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return attempt, fmt.Errorf("%s: %w; the server asks to retry in %s, after this agent's deadline (--timeout, %s left): giving up now (%w; a longer --timeout waits it out)",
				path, err, wait, time.Until(deadline).Round(time.Second), context.DeadlineExceeded)
		}
		c.progress("%s: %v; retrying in %s (attempt %d)", path, err, wait, attempt)
		if serr := c.sleep(ctx, wait); serr != nil {
			return attempt, fmt.Errorf("%s: gave up (%w); last error: %w", path, serr, err)
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

// once makes one request; a retryable failure returns the server's
// Retry-After (0 if none).
func (c *Client) once(ctx context.Context, method, path string, body []byte, header map[string]string, out any) (time.Duration, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	// Whoever built the Client: https only, and no redirect followed.
	if err := CheckServerURL(c.BaseURL); err != nil {
		return 0, fmt.Errorf("agent: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return 0, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	hc := *c.HTTP
	hc.CheckRedirect = noRedirect
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
		if err != nil {
			return 0, err
		}
		return 0, json.Unmarshal(b, out)
	}
	// A refusal's or a "not yet"'s body is shown on the console: a few KiB
	// of it at most, the rest never read.
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBody))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode >= 500 {
		// The server says why (its refusal body): on the console, so the
		// operator sees what to fix while the machine waits.
		var why api.Refusal
		if json.Unmarshal(b, &why) == nil && why.Reason != "" {
			return retryAfter(resp.Header.Get("Retry-After")), fmt.Errorf("server not ready (%d %s: %s)", resp.StatusCode, safetext.Cut(string(why.Reason), maxReasonLen), safetext.Cut(why.Detail, 512))
		}
		return retryAfter(resp.Header.Get("Retry-After")), fmt.Errorf("server not ready (%d)", resp.StatusCode)
	}
	return 0, refusalOf(resp, b)
}

// retryAfter reads a Retry-After of delay-seconds: 0 when absent, not a
// number or not positive, at most maxRetryAfter.
func retryAfter(v string) time.Duration {
	secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	switch {
	case err != nil || secs <= 0:
		return 0
	case secs >= int64(maxRetryAfter/time.Second):
		return maxRetryAfter
	}
	return time.Duration(secs) * time.Second
}

func (c *Client) progress(format string, args ...any) {
	if c.Progress != nil {
		c.Progress(format, args...)
	}
}

func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	if c.Sleep != nil {
		return c.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Report tells the server why this node failed (POST /report/v1), once,
// within 10 s, whatever ctx says (a run that timed out still reports). It
// carries the last challenge's session and, with KubeletKey, a proof over
// it, so the server can say the report comes from this machine;
// otherwise the server records it as unauthenticated. It returns how the
// server recorded it.
func (c *Client) Report(ctx context.Context, rep api.ReportRequest) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if len(rep.Detail) > api.MaxReportDetail {
		rep.Detail = strings.ToValidUTF8(rep.Detail[:api.MaxReportDetail], "")
	}
	if c.session != "" && c.KubeletKey != nil {
		proof, err := attest.SignKeyProof(c.KubeletKey, c.session)
		if err != nil {
			return "", err
		}
		rep.Session, rep.KubeletKeyProof = c.session, proof
	}
	body, err := json.Marshal(rep)
	if err != nil {
		return "", err
	}
	var resp api.ReportResponse
	if _, err := c.once(ctx, http.MethodPost, api.PathReport, body, map[string]string{"Content-Type": "application/json"}, &resp); err != nil {
		return "", err
	}
	return resp.Authenticated, nil
}
