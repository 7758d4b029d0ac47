// Package approver approves kubelet certificate signing requests with the
// evidence that released the node's config: a kubelet client CSR is
// approved only when a NodeAttestation record (written by nodeproof's
// server after a TPM quote or a cloud identity document verified) carries
// the SHA-256 of exactly the CSR's public key, and the record is consumed
// by that approval, so one attestation yields one certificate.
//
// It is built like Kubernetes' csrapproving controller: a table of
// recognizers (recognize: the kubelet client and kubelet serving signers,
// with the shape checks a kubelet's CSR passes) and a decision per
// recognized CSR (Decider.Decide, whose doc comment lists every check and
// its Reason). The Controller runs the decisions over client-go informers
// and a work queue, writes Approved or Denied conditions through the
// approval subresource (reason and message name the evidence kind and the
// record), emits a Warning event on the CSR for every denial and every
// CSR it leaves pending (kubectl describe csr shows why; an approval's
// condition says why by itself, so it writes no event), and counts them in
// Prometheus metrics. A per-node-name rate limit replaces the single
// global breaker of other approvers: a flood of CSRs for one name delays
// only that name. Several replicas run under leader election on a Lease
// (RunLeader): each term runs a fresh Controller, and a replica that loses
// the Lease stops acting and campaigns again in the same process.
//
// What the approver never does: approve on the requester's identity
// alone; approve a second certificate with one record; approve a CSR for
// a node whose record names a bootstrap token from any other requester.
// CSRs of other signers, and kubelet CSRs without evidence, are left
// pending for another approver unless Decider.DenyUnattested is set.
package approver
