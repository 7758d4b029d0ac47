package mcs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/store"
)

// Event reasons of a node's failure report.
const (
	// ReasonNodeReport: a report whose sender proved the kubelet key of a
	// session the server issued.
	ReasonNodeReport attest.Reason = "NodeReportedFailure"
	// ReasonNodeReportUnauthenticated: a report without that proof.
	ReasonNodeReportUnauthenticated attest.Reason = "NodeReportedFailureUnauthenticated"
)

// reportReasonRE is what a report's reason may be.
var reportReasonRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// maxReportSessionAge bounds how old the session of a report may be: a
// node reports right after the attempt failed.
const maxReportSessionAge = time.Hour

// report records a node's report of its failure (api.ReportRequest) as an
// Event on the node name's NodeBinding (Options.Events) and a log line.
// Checks, in order:
//   - the secure port only (InsecurePortRefused), within the source's
//     attestation rate (RateLimited);
//   - a JSON body of at most api.MaxReportBody, no unknown fields
//     (BodyTooLarge, MalformedRequest);
//   - a pool the server serves (UnknownPool), a node name that is a
//     DNS-1123 subdomain, a stage of api.ReportStages and a reason of
//     letters, digits and . _ - (MalformedRequest); the detail is cut to
//     api.MaxReportDetail bytes and stripped of control characters;
//   - with a session: it opens (SessionInvalid), is for the report's pool
//     and, if it named a node, that node (MalformedRequest), was issued
//     within the last hour (SessionExpired), and the kubelet key proof
//     over it verifies (KubeletKeyProofInvalid). A proven session says who
//     sent the report, not that the sender owns the node name (any
//     genuine machine can ask for any name at its challenge), so: when
//     the name is bound and the session's kubelet key is the binding's,
//     the report is "owner"-authenticated; when the name is bound to
//     another key, it is recorded as unauthenticated; when no identity
//     owns the name, it is "session"-authenticated: the machine that
//     tried to enrol under that name says why it could not. Without a
//     session it is recorded as unauthenticated. The Event says which;
//   - at most the per-identity rate of reports per node name
//     (RateLimited), so no sender can bury a node's Events.
//
// A report is never used for a decision: it only tells the operator.
func (s *Server) report(w http.ResponseWriter, r *http.Request, d *decision) {
	var req api.ReportRequest
	if err := decodeBody(w, r, api.MaxReportBody, &req); err != nil {
		s.refuse(w, d, err)
		return
	}
	d.pool, d.node = req.Pool, req.NodeName
	switch {
	case !s.poolExists(req.Pool):
		s.refuse(w, d, deny(ReasonUnknownPool, "no pool %q", req.Pool))
		return
	case len(req.NodeName) > 253 || !nodeNameRE.MatchString(req.NodeName):
		s.refuse(w, d, deny(ReasonMalformedRequest, "nodeName must be a DNS-1123 subdomain"))
		return
	case !slices.Contains(api.ReportStages, req.Stage):
		s.refuse(w, d, deny(ReasonMalformedRequest, "stage must be one of %v", api.ReportStages))
		return
	case !reportReasonRE.MatchString(req.Reason):
		s.refuse(w, d, deny(ReasonMalformedRequest, "reason must be 1 to 64 letters, digits, '.', '_' or '-'"))
		return
	}
	auth := "none"
	if req.Session != "" {
		ss, err := s.openSession(req.Session)
		if err != nil {
			s.refuse(w, d, err)
			return
		}
		switch {
		case ss.Session.Pool != req.Pool:
			s.refuse(w, d, deny(ReasonMalformedRequest, "the session is for pool %s", ss.Session.Pool))
			return
		case ss.NodeName != "" && ss.NodeName != req.NodeName:
			s.refuse(w, d, deny(ReasonMalformedRequest, "the session is for node %s", ss.NodeName))
			return
		case s.o.Clock().Sub(ss.Session.IssuedAt) > maxReportSessionAge:
			s.refuse(w, d, deny(attest.ReasonSessionExpired, "a report's session must be less than %s old", maxReportSessionAge))
			return
		}
		if err := attest.VerifyKeyProof(ss.KubeletPublicKey, req.Session, req.KubeletKeyProof); err != nil {
			s.refuse(w, d, err)
			return
		}
		if auth, err = s.reportOwner(r.Context(), req.NodeName, ss.Session.KubeletKeySHA256); err != nil {
			s.refuse(w, d, err)
			return
		}
	}
	if ok, wait := s.o.Limits.PerIdentity.Allow("report/" + req.NodeName); !ok {
		s.refuse(w, d, later(wait, deny(ReasonRateLimited, "too many reports for node %s; retry later", req.NodeName)))
		return
	}
	detail := cleanDetail(req.Detail)
	reason, msg := ReasonNodeReport, fmt.Sprintf("node %s (pool %s) reports %s failed: %s: %s (the sender proved the kubelet key its node name is bound to; from %s)",
		req.NodeName, req.Pool, req.Stage, req.Reason, detail, d.remote)
	if auth == "session" {
		msg = fmt.Sprintf("a machine trying to enrol as node %s (pool %s) reports %s failed: %s: %s (the sender proved the kubelet key of its own session; no identity owns the name; from %s)",
			req.NodeName, req.Pool, req.Stage, req.Reason, detail, d.remote)
	}
	if auth == "none" {
		reason, msg = ReasonNodeReportUnauthenticated, fmt.Sprintf("UNAUTHENTICATED report (used for no decision) for node %s (pool %s): %s failed: %s: %s (from %s)",
			req.NodeName, req.Pool, req.Stage, req.Reason, detail, d.remote)
	}
	s.event(req.NodeName, true, reason, msg)
	s.o.Log.Warn("node report", "node", req.NodeName, "pool", req.Pool, "stage", req.Stage, "reported", req.Reason, "authenticated", auth, "detail", detail, "remote", d.remote)
	writeJSON(w, d, api.ReportResponse{Authenticated: auth})
}

// cleanDetail cuts a report's detail to api.MaxReportDetail bytes (on a
// rune boundary) and replaces control characters, so it cannot forge
// lines in a log or an Event.
func cleanDetail(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, " "))
	if len(s) > api.MaxReportDetail {
		s = strings.ToValidUTF8(s[:api.MaxReportDetail], "") // a rune cut in two is dropped
	}
	return s
}

// reportOwner is how far a report with a proven session is authenticated
// for node: "owner" when node's binding holds the session's kubelet key,
// "none" when it holds another or is revoked, "session" when no identity
// owns node.
func (s *Server) reportOwner(ctx context.Context, node string, keySHA256 []byte) (string, error) {
	b, err := s.o.Store.Binding(ctx, node)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "session", nil
	case err != nil:
		return "", later(time.Second, deny(ReasonUnavailable, "the store: %v", err))
	case b.Revoked != nil:
		return "none", nil // a banned identity owns nothing, its reports included
	case attest.Equal(b.KubeletKeySHA256, keySHA256):
		return "owner", nil
	}
	return "none", nil
}
