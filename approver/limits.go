package approver

import (
	"context"
	"strings"

	certv1 "k8s.io/api/certificates/v1"
)

// LimitKey is whose budget csr spends in the controller's limits: its
// requester when the requester is one machine's — a node's own
// credentials (system:node:NAME), or a bootstrap token nodeproof issued
// for one node (a record names it: Decider.Tokens) — so a flood from
// one machine, whatever names it asks for, delays only that machine. A
// requester many machines may share (a bootstrap token no record names, a
// service account such as OpenShift's node-bootstrapper) cannot tell the
// machines apart: its CSRs spend the budget of the requester and the node
// name they ask for. It never reads the API server.
func (d *Decider) LimitKey(ctx context.Context, csr *certv1.CertificateSigningRequest) string {
	req := csr.Spec.Username
	if strings.HasPrefix(req, NodeUserPrefix) {
		return req
	}
	if id, ok := strings.CutPrefix(req, BootstrapUserPrefix); ok {
		if d.Tokens != nil {
			if nodes, err := tokenNodes(ctx, d.Tokens, id, d.Clock()); err == nil && len(nodes) > 0 {
				return req
			}
		}
	}
	node := ""
	if k, _, _ := recognize(csr); k != nil {
		node = k.nodeName
	}
	return req + "\x00" + node
}
