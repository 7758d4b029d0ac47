package mcs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/store"
)

const sessionPurpose = "attest-session"

// sealedSession is what the session box holds.
type sealedSession struct {
	Session  attest.Session `json:"session"`
	NodeName string         `json:"nodeName,omitempty"`
}

// nodeNameRE is a DNS-1123 subdomain, what Kubernetes allows a node name.
var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// decodeBody reads a JSON body strictly: bounded, one object, no unknown
// fields. It decodes as it reads (no copy of the raw body: a verify body
// carries an event log, and a thousand machines attest at once).
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return deny(ReasonMalformedRequest, "Content-Type must be application/json")
	}
	if r.ContentLength > limit {
		return deny(ReasonBodyTooLarge, "body exceeds %d bytes", limit)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Only white space may follow the object.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("body holds more than one JSON value")
			if terr != nil {
				err = terr
			}
		}
	}
	var tooBig *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooBig):
		return deny(ReasonBodyTooLarge, "body exceeds %d bytes", limit)
	}
	return deny(ReasonMalformedRequest, "body: %v", err)
}

func writeJSON(w http.ResponseWriter, d *decision, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // our own types always marshal
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	d.status = http.StatusOK
}

// challenge answers POST /attest/v1/challenge.
//
// Checks before any cryptography: the body (bounded, strict JSON), the pool
// is in the policy (PoolNotInPolicy) and takes this kind of evidence
// (EvidenceKindNotAllowed), a verifier for the kind is configured, the
// kubelet key parses, the requested node name (if any) is a DNS name. Then
// the kind's verifier checks the identity (attest/tpm: EK and AK) and makes
// the challenge; the session is sealed, so nothing is stored.
func (s *Server) challenge(w http.ResponseWriter, r *http.Request, d *decision) {
	var req api.ChallengeRequest
	if err := decodeBody(w, r, api.MaxChallengeBody, &req); err != nil {
		s.refuse(w, d, err)
		return
	}
	d.pool = req.Pool
	pp, ok := s.o.Policy.Pools[req.Pool]
	if !ok {
		s.refuse(w, d, deny(attest.ReasonPolicyUnknownPool, "pool %q is not in the policy", req.Pool))
		return
	}
	if !slices.Contains(pp.Evidence, req.Kind) {
		s.refuse(w, d, deny(attest.ReasonPolicyKindNotAllowed, "pool %s does not accept %q evidence", req.Pool, req.Kind))
		return
	}
	if req.NodeName != "" && (len(req.NodeName) > 253 || !nodeNameRE.MatchString(req.NodeName)) {
		s.refuse(w, d, deny(ReasonMalformedRequest, "nodeName is not a DNS name"))
		return
	}
	keySHA, err := attest.KeySHA256(req.KubeletPublicKey)
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	var resp api.ChallengeResponse
	var sess *attest.Session
	switch req.Kind {
	case attest.KindTPM:
		if s.o.TPM == nil || req.TPM == nil {
			s.refuse(w, d, deny(attest.ReasonMalformed, "TPM evidence needs a tpm request and a TPM verifier"))
			return
		}
		resp.TPM, sess, err = s.o.TPM.Challenge(req.Pool, keySHA, req.TPM)
	case attest.KindGCP:
		if s.o.GCP == nil || req.GCP == nil {
			s.refuse(w, d, deny(attest.ReasonMalformed, "GCP evidence needs a gcp request and a GCP verifier"))
			return
		}
		resp.GCP, sess, err = s.o.GCP.Challenge(req.Pool, keySHA, req.GCP)
	case attest.KindAWS:
		if s.o.AWS == nil || req.AWS == nil {
			s.refuse(w, d, deny(attest.ReasonMalformed, "AWS evidence needs an aws request and an AWS verifier"))
			return
		}
		resp.AWS, sess, err = s.o.AWS.Challenge(req.Pool, keySHA, req.AWS)
	default:
		err = deny(attest.ReasonPolicyKindNotAllowed, "no verifier for %q evidence", req.Kind)
	}
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	b, err := json.Marshal(sealedSession{Session: *sess, NodeName: req.NodeName})
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	if resp.Session, err = s.o.Keys.Seal(sessionPurpose, b); err != nil {
		s.refuse(w, d, err)
		return
	}
	resp.Expires = sess.Expires
	writeJSON(w, d, &resp)
}

// verify answers POST /attest/v1/verify.
//
// Checks: the body; the session opens (SessionInvalid: forged, tampered, or
// sealed by keys this server no longer has); the kind's verifier (every
// check in its doc comment; expiry included); policy for the session's
// pool; a node name (from the evidence, or requested when the pool allows
// it: NodeNameNotEstablished). In cluster mode the node's bootstrap token
// is issued next. Then, in one durable store transaction, the
// NodeAttestation record is written and the session marked used
// (SessionReused: nothing is written). Only then is the config token
// returned. No refusal writes anything.
func (s *Server) verify(w http.ResponseWriter, r *http.Request, d *decision) {
	var req api.VerifyRequest
	if err := decodeBody(w, r, api.MaxVerifyBody, &req); err != nil {
		s.refuse(w, d, err)
		return
	}
	raw, err := s.o.Keys.Open(sessionPurpose, req.Session)
	if err != nil {
		s.refuse(w, d, deny(attest.ReasonSessionInvalid, "session does not open"))
		return
	}
	var ss sealedSession
	if err := json.Unmarshal(raw, &ss); err != nil {
		s.refuse(w, d, deny(attest.ReasonSessionInvalid, "session does not decode"))
		return
	}
	sess := &ss.Session
	d.pool = sess.Pool
	var claims *attest.Claims
	switch sess.Kind {
	case attest.KindTPM:
		if s.o.TPM == nil || req.TPM == nil {
			s.refuse(w, d, deny(attest.ReasonMalformed, "TPM session needs tpm evidence"))
			return
		}
		claims, err = s.o.TPM.Verify(sess, req.TPM)
	case attest.KindGCP:
		if s.o.GCP == nil || req.GCP == nil {
			s.refuse(w, d, deny(attest.ReasonMalformed, "GCP session needs gcp evidence"))
			return
		}
		claims, err = s.o.GCP.Verify(r.Context(), sess, req.GCP)
	case attest.KindAWS:
		if s.o.AWS == nil || req.AWS == nil {
			s.refuse(w, d, deny(attest.ReasonMalformed, "AWS session needs aws evidence"))
			return
		}
		claims, err = s.o.AWS.Verify(r.Context(), sess, req.AWS)
	default:
		err = deny(attest.ReasonSessionInvalid, "session of unknown kind")
	}
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	if err := s.o.Policy.Evaluate(sess.Pool, claims); err != nil {
		s.refuse(w, d, err)
		return
	}
	node := claims.NodeName
	if claims.AWS != nil && s.o.Policy.Pools[sess.Pool].AWS.NodeName == policy.AWSNodeNameInstanceID {
		node = claims.AWS.InstanceID
	}
	if node == "" && s.o.Policy.ServeFor(sess.Pool).NodeNames == "requested" {
		node = ss.NodeName
	}
	if node == "" {
		s.refuse(w, d, deny(attest.ReasonPolicyNodeNameMissing, "the evidence names no node and pool %s takes no requested names", sess.Pool))
		return
	}
	d.node = node
	now := s.o.Clock()
	id, err := randomID()
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	rec := &store.Record{
		ID: id, NodeName: node, Pool: sess.Pool, Kind: claims.Kind, Identity: claims.Identity,
		KubeletKeySHA256: claims.KubeletKeySHA256, Addresses: claims.Addresses,
		Summary: summarize(claims), CreatedAt: now, Expires: now.Add(s.o.RecordTTL),
	}
	if s.o.Bootstrap != nil {
		if err := s.o.Bootstrap.Issue(r.Context(), rec); err != nil {
			s.refuse(w, d, err)
			return
		}
	}
	once := []store.Once{{Key: "session/" + hex.EncodeToString(sess.Nonce), Expires: sess.Expires}}
	if claims.AWS != nil {
		// Trust on first use: one enrolment per instance while its
		// document can be accepted at all.
		once = append(once, store.Once{Key: aws.OnceKey(claims.AWS), Expires: s.o.AWS.AcceptedUntil(claims.AWS)})
	}
	if err := s.o.Store.CreateRecord(r.Context(), rec, once...); err != nil {
		if rec.BootstrapTokenID != "" {
			if rerr := s.o.Bootstrap.Revoke(context.WithoutCancel(r.Context()), rec); rerr != nil {
				s.o.Log.Error("revoke bootstrap token of an unwritten record", "node", node, "err", rerr.Error())
			}
		}
		if errors.Is(err, store.ErrUsed) && claims.AWS != nil {
			s.refuse(w, d, deny(attest.ReasonInstanceEnrolled, "instance %s of account %s already enrolled with this document (trust on first use); re-enrol a reinstalled instance with: nodeproof enroll --reset %s",
				claims.AWS.InstanceID, claims.AWS.AccountID, aws.OnceKey(claims.AWS)))
		} else if errors.Is(err, store.ErrUsed) {
			s.refuse(w, d, deny(attest.ReasonSessionReused, "this session was already answered"))
		} else {
			s.refuse(w, d, err)
		}
		return
	}
	d.record = id
	tokID, err := tokens.NewTokenID()
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	exp := now.Add(s.o.ConfigTokenTTL)
	tok, err := tokens.IssueConfigToken(s.o.Keys, tokens.ConfigToken{ID: tokID, RecordID: id, NodeName: node, Pool: sess.Pool, Expires: exp})
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	writeJSON(w, d, &api.VerifyResponse{ConfigToken: tok, Expires: exp, NodeName: node, Pool: sess.Pool, Record: id})
}

func randomID() (string, error) {
	b := make([]byte, 12)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// summarize describes claims in one line for records and logs (no
// secrets: claims hold none).
func summarize(c *attest.Claims) string {
	switch {
	case c.GCP != nil:
		return fmt.Sprintf("gcp project=%s zone=%s instance=%s (%s)", c.GCP.ProjectID, c.GCP.Zone, c.GCP.InstanceName, c.GCP.InstanceID)
	case c.AWS != nil:
		return fmt.Sprintf("aws account=%s region=%s instance=%s live=%v", c.AWS.AccountID, c.AWS.Region, c.AWS.InstanceID, c.AWS.LiveChecked)
	case c.TPM == nil:
		return string(c.Kind) + " " + c.Identity
	}
	b := c.TPM.Boot
	sb := "unknown"
	if b.SecureBootKnown {
		sb = map[bool]string{true: "on", false: "off"}[b.SecureBoot]
	}
	return fmt.Sprintf("tpm ek=%s… trust=%s bank=%s secureBoot=%s kernel=%.16s",
		c.TPM.EKSHA256[:16], c.TPM.EKTrust, c.TPM.PCRBank, sb, b.Kernel)
}
