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
// Prometheus metrics. A per-requester rate limit (Decider.LimitKey: a
// node's own credentials, a per-node bootstrap token) replaces the single
// global breaker of other approvers: a flood of CSRs from one machine,
// whatever names they ask for, delays only that machine. Runner wires it all
// in a cluster (`nodeproof approve`): several replicas run under leader
// election on the Lease nodeproof-approver (package leader), each term
// runs a fresh Controller (and NodeController) on one watch of records
// and bindings, and a replica that loses the Lease stops acting and
// campaigns again in the same process.
//
// The Controller also watches the certificates issued for kubelet client
// CSRs and records those of each name's current owner in its lineage
// (Decider.RecordIssued, store.Lineage); a renewal or a serving CSR the
// node makes itself is approved only when the client certificate that
// made it, named by the credential ID the API server records in the CSR,
// is in that lineage.
//
// What the approver never does: approve on the requester's identity
// alone; approve a second certificate with one record; approve a CSR for
// a node whose record names a bootstrap token from any other requester;
// approve any CSR for a node that is not attested; approve a renewal from
// a certificate that is not the current owner's kubelet's.
// CSRs of other signers, and kubelet CSRs without evidence, are left
// pending for another approver unless Decider.DenyUnattested is set.
package approver
