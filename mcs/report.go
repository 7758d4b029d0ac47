package mcs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/limit"
	"github.com/nodeproof/nodeproof/safetext"
	"github.com/nodeproof/nodeproof/store"
)

// reportReasonRE is what a report's reason may be.
var reportReasonRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// maxReportSessionAge bounds how old the session of a report may be: a
// node reports right after the attempt failed.
const maxReportSessionAge = time.Hour

// report records a node's report of its failure (api.ReportRequest) as an
// Event on the node name's NodeBinding (Options.Events, on the report
// path: its budget is not the decisions') and a log line. Checks, in
// order:
//   - the secure port only (InsecurePortRefused), within the source's
//     attestation rate (RateLimited);
//   - a JSON body of at most api.MaxReportBody, no unknown fields
//     (BodyTooLarge, MalformedRequest);
//   - a pool the server serves (UnknownPool), a node name that is a
//     DNS-1123 subdomain, a stage of api.ReportStages and a reason of
//     letters, digits and . _ - (MalformedRequest);
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
//   - an authenticated report: at most the per-identity rate of reports
//     per node name (RateLimited);
//   - an unauthenticated one: its detail cut to
//     api.MaxUnauthenticatedReportDetail bytes, then within
//     Limits.UnauthenticatedReports and Limits.UnauthenticatedReportBytes
//     (its Event's message length), per source address and per node name
//     (RateLimited), so that no sender can bury a node's Events or its own
//     reports, nor write without bound.
//
// The detail passes through safetext (control, format and separator
// characters replaced) and is cut to api.MaxReportDetail bytes. A report
// is never used for a decision: it only tells the operator.
func (s *Server) report(w http.ResponseWriter, r *http.Request, d *decision) {
	var req api.ReportRequest
	if err := decodeBody(w, r, api.MaxReportBody, &req); err != nil {
		s.refuse(w, d, err)
		return
	}
	d.pool, d.node = req.Pool, req.NodeName
	switch {
	case !s.poolExists(req.Pool):
		s.refuse(w, d, deny(attest.ReasonUnknownPool, "no pool %q", req.Pool))
		return
	case !attest.ValidNodeName(req.NodeName):
		s.refuse(w, d, deny(attest.ReasonMalformedRequest, "nodeName must be a DNS-1123 subdomain"))
		return
	case !slices.Contains(api.ReportStages, req.Stage):
		s.refuse(w, d, deny(attest.ReasonMalformedRequest, "stage must be one of %v", api.ReportStages))
		return
	case !reportReasonRE.MatchString(req.Reason):
		s.refuse(w, d, deny(attest.ReasonMalformedRequest, "reason must be 1 to 64 letters, digits, '.', '_' or '-'"))
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
			s.refuse(w, d, deny(attest.ReasonMalformedRequest, "the session is for pool %s", ss.Session.Pool))
			return
		case ss.NodeName != "" && ss.NodeName != req.NodeName:
			s.refuse(w, d, deny(attest.ReasonMalformedRequest, "the session is for node %s", ss.NodeName))
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
	reason, msg, detail := attest.ReasonNodeReport, "", safetext.Cut(req.Detail, api.MaxReportDetail)
	switch auth {
	case "owner":
		msg = fmt.Sprintf("node %s (pool %s) reports %s failed: %s: %s (the sender proved the kubelet key its node name is bound to; from %s)",
			req.NodeName, req.Pool, req.Stage, req.Reason, detail, d.remote)
	case "session":
		msg = fmt.Sprintf("a machine trying to enrol as node %s (pool %s) reports %s failed: %s: %s (the sender proved the kubelet key of its own session; no identity owns the name; from %s)",
			req.NodeName, req.Pool, req.Stage, req.Reason, detail, d.remote)
	default:
		detail = safetext.Cut(req.Detail, api.MaxUnauthenticatedReportDetail)
		reason, msg = attest.ReasonNodeReportUnauthenticated, fmt.Sprintf("UNAUTHENTICATED report (used for no decision) for node %s (pool %s): %s failed: %s: %s (from %s)",
			req.NodeName, req.Pool, req.Stage, req.Reason, detail, d.remote)
	}
	if ok, wait := s.allowReport(auth, req.NodeName, d.remote, len(msg)); !ok {
		s.refuse(w, d, later(wait, deny(attest.ReasonRateLimited, "too many reports for node %s or from this address; retry later", req.NodeName)))
		return
	}
	if s.o.Events != nil {
		s.o.Events.Report(req.NodeName, string(reason), msg)
	}
	s.o.Log.Warn("node report", "node", req.NodeName, "pool", req.Pool, "stage", req.Stage, "reported", req.Reason, "authenticated", auth, "detail", detail, "remote", d.remote)
	writeJSON(w, d, api.ReportResponse{Authenticated: auth})
}

// allowReport takes a report's share of its limits: an authenticated
// one's from the per-identity rate of its node name; an unauthenticated
// one's (whose Event message is size bytes) from the count and the byte
// budgets of its source address and of its node name, all or none.
func (s *Server) allowReport(auth, node, remote string, size int) (bool, time.Duration) {
	if auth != "none" {
		return s.o.Limits.PerIdentity.Allow("report/" + node)
	}
	keys := []string{"source/" + limit.SourceKey(remote), "name/" + node}
	undo, ok, wait := s.o.Limits.UnauthenticatedReports.Reserve(1, keys...)
	if !ok {
		return false, wait
	}
	if _, ok, wait = s.o.Limits.UnauthenticatedReportBytes.Reserve(size, keys...); !ok {
		undo()
	}
	return ok, wait
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
		return "", later(time.Second, deny(attest.ReasonUnavailable, "the store: %v", err))
	case b.Revoked != nil:
		return "none", nil // a banned identity owns nothing, its reports included
	case attest.Equal(b.KubeletKeySHA256, keySHA256):
		return "owner", nil
	}
	return "none", nil
}
