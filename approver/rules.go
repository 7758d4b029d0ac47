package approver

import (
	"context"
	"errors"
	"fmt"
	"time"

	certv1 "k8s.io/api/certificates/v1"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
)

// Unattested is a rule's outcome for a CSR nodeproof holds no evidence
// for: left pending for another approver (Leave), or denied with
// Decider.DenyUnattested (Deny). It is never a Decision's Action.
const Unattested Action = "leave, or deny with DenyUnattested"

// Outcome is one decision a rule can make: its reason and its action. An
// approval's reason is attest.ReasonAttested(kind); the table writes its
// prefix.
type Outcome struct {
	Reason attest.Reason
	Action Action
}

// approved is the outcome of an approval, whatever the evidence kind.
var approved = Outcome{attest.ReasonAttestedPrefix, Approve}

// Rule is one of the approver's rules. Decide applies them in the order of
// Rules, as Kubernetes' csrapproving controller lists its recognizers
// (pkg/controller/certificates/approver/sarapprove.go): the first rule
// that judges a CSR and decides it makes the decision; a rule that judges
// a CSR and finds nothing wrong passes it on.
type Rule struct {
	// Name says what the rule checks.
	Name string
	// About says why, and how it decides.
	About string
	// Outcomes are every decision the rule can make.
	Outcomes []Outcome

	judges func(f *facts) bool
	decide func(ctx context.Context, d *Decider, f *facts) (Decision, bool, error)
}

// facts are what the rules read about a CSR: the CSR, what recognize made
// of it, the binding of its node name (nil: the name is bound to no
// identity) and the records for the name, each read once.
type facts struct {
	csr      *certv1.CertificateSigningRequest
	k        *kubeletCSR
	b        *store.Binding
	recs     []*store.Record
	recsRead bool
}

// records reads the records for the node name once.
func (f *facts) records(ctx context.Context, d *Decider) ([]*store.Record, error) {
	if !f.recsRead {
		recs, err := d.Store.RecordsForNode(ctx, f.k.nodeName)
		if err != nil {
			return nil, fmt.Errorf("approver: records for %s: %w", f.k.nodeName, err)
		}
		f.recs, f.recsRead = recs, true
	}
	return f.recs, nil
}

// byNode reports whether the node itself asks (its kubelet's client
// certificate: requester system:node:NAME).
func (f *facts) byNode() bool { return f.k.requester == NodeUserPrefix+f.k.nodeName }

// Rules is every rule, in the order Decide applies them. Every decision
// rests on the node name's binding (store.Binding): the identity that
// enrolled with the name first owns it, and only records of that identity
// count — for a client CSR, only records that bound the binding's kubelet
// key (the enrolment's), never just the newest record for the name.
func Rules() []Rule {
	unattested := func(r attest.Reason) Outcome { return Outcome{r, Unattested} }
	deny := func(r attest.Reason) Outcome { return Outcome{r, Deny} }
	return []Rule{
		{
			Name: "a kubelet's CSR",
			About: "recognize's shape checks (its doc comment lists them): a CSR of another signer is left alone; " +
				"one that is not what a kubelet sends is left to another approver (denied with DenyUnattested), " +
				"except an extension no kubelet requests, which no approver should grant",
			Outcomes: []Outcome{{attest.ReasonNotKubelet, Leave}, unattested(attest.ReasonBadCSR), unattested(attest.ReasonBadSubject),
				unattested(attest.ReasonKeyNotAllowed), unattested(attest.ReasonSANsNotAllowed), unattested(attest.ReasonUsagesNotAllowed),
				unattested(attest.ReasonRequesterMismatch), deny(attest.ReasonExtensionNotAllowed)},
			judges: func(*facts) bool { return true },
			decide: ruleShape,
		},
		{
			Name: "a bootstrap token asks for its own node",
			About: "a CSR made with a bootstrap token (requester system:bootstrap:<id>) that nodeproof issued for one node " +
				"(the unexpired records naming the token, store.TokenIndex) but whose CN names another is denied, whatever else it carries; " +
				"a token the index does not know (none, or a shared token no record names) is not judged here",
			Outcomes: []Outcome{deny(attest.ReasonTokenOtherNode)},
			judges:   func(*facts) bool { return true },
			decide: func(ctx context.Context, d *Decider, f *facts) (Decision, bool, error) {
				return d.tokenForOtherNode(ctx, f.k)
			},
		},
		{
			Name: "the owner is attested",
			About: "any CSR for a node whose owner is not attested (store.Binding.Attested, with StaleAfter of the binding's pool), " +
				"whoever the requester — a bootstrap token, the node itself, anyone — client or serving, is denied: " +
				"Revoked, AttestationFailed (its latest attestation was refused) or AttestationStale (none passed within the window)",
			Outcomes: []Outcome{deny(attest.ReasonRevoked), deny(attest.ReasonAttestationFailed), deny(attest.ReasonAttestationStale)},
			judges:   func(f *facts) bool { return f.b != nil },
			decide:   ruleOwnerAttested,
		},
		{
			Name: "the node's own CSR comes from the owner's kubelet",
			About: "a CSR the node makes itself (requester system:node:NAME: a client certificate's renewal, any serving certificate) " +
				"of a bound name carries the API server's credential ID of the client certificate that authenticated it " +
				"(spec.extra authentication.kubernetes.io/credential-id, exactly one value X509SHA256=<64 hex digits>), " +
				"and that certificate is in the lineage of the binding's enrolment (store.Lineage: certificates issued for CSRs of " +
				"this enrolment's kubelet, RecordIssued)",
			Outcomes: []Outcome{deny(attest.ReasonNoClientCertificate), deny(attest.ReasonNotCurrentOwner)},
			judges:   func(f *facts) bool { return f.b != nil && f.byNode() },
			decide: func(ctx context.Context, d *Decider, f *facts) (Decision, bool, error) {
				return d.notCurrentOwner(ctx, f.csr, f.k, f.b)
			},
		},
		{
			Name: "a client certificate's renewal",
			About: "a client CSR the node makes itself (its certificate manager renewing with a new key) is approved once the rules " +
				"above passed: the owner attested, the request made with a certificate of its lineage; with no binding, no evidence",
			Outcomes: []Outcome{approved, unattested(attest.ReasonNoAttestation)},
			judges:   func(f *facts) bool { return f.k.signer == SignerKubeletClient && f.byNode() },
			decide: func(_ context.Context, d *Decider, f *facts) (Decision, bool, error) {
				return d.renewal(f.k, f.b), true, nil
			},
		},
		{
			Name: "a serving certificate's SANs are attested",
			About: "a serving CSR (the node's own: recognize checks the requester) is decided on the newest record of the identity " +
				"that owns the node name, expired or consumed ones included (the serving certificate comes after the client " +
				"certificate the record approved, and is renewed while the node lives): every DNS SAN (case-insensitively) and IP SAN " +
				"(IPv4-mapped IPv6 as its IPv4 form) among the names and IPs it attested; SANs of a kind the evidence cannot attest " +
				"at all (GCP: no IPs; a vendor-CA TPM: no address) are left to another approver. The serving key is not bound by " +
				"evidence; the client certificate that authenticates the request was",
			Outcomes: []Outcome{approved, unattested(attest.ReasonNoAttestation), unattested(attest.ReasonNoAddresses), deny(attest.ReasonSANNotAttested)},
			judges:   func(f *facts) bool { return f.k.signer == SignerKubeletServing },
			decide:   ruleServing,
		},
		{
			Name: "a first client certificate's key was attested",
			About: "a first kubelet client CSR is approved only when an unexpired record for the CN's node name, of the identity that " +
				"owns the name and with the binding's kubelet key, carries the SHA-256 of exactly this CSR's public key and was not " +
				"consumed by another CSR, and, when that record names a bootstrap token, the requester is system:bootstrap:<token id>; " +
				"approving consumes the record (one attestation, one certificate). Revoked: the store refuses to consume a record of " +
				"a banned identity (a ban the binding does not show yet)",
			Outcomes: []Outcome{approved, unattested(attest.ReasonNoAttestation), unattested(attest.ReasonRecordExpired),
				deny(attest.ReasonNodeNameTaken), deny(attest.ReasonKeyNotAttested), deny(attest.ReasonRecordConsumed),
				deny(attest.ReasonRequesterMismatch), deny(attest.ReasonRevoked)},
			judges: func(f *facts) bool { return f.k.signer == SignerKubeletClient },
			decide: func(ctx context.Context, d *Decider, f *facts) (Decision, bool, error) {
				recs, err := f.records(ctx, d)
				if err != nil {
					return Decision{}, false, err
				}
				dec, err := d.client(ctx, f.csr, f.k, f.b, recs)
				return dec, err == nil, err
			},
		},
	}
}

// ruleShape runs recognize, and reads the binding of the CSR's node name
// for the rules after it.
func ruleShape(ctx context.Context, d *Decider, f *facts) (Decision, bool, error) {
	k, reason, msg := recognize(f.csr)
	switch {
	case k == nil && reason == attest.ReasonNotKubelet:
		return Decision{Action: Leave, Reason: reason, Message: msg}, true, nil
	case k == nil && reason == attest.ReasonExtensionNotAllowed:
		// No kubelet asks for it; no approver should grant it.
		return Decision{Action: Deny, Reason: reason, Message: msg}, true, nil
	case k == nil:
		return d.unattested(Decision{Reason: reason, Message: msg}), true, nil
	}
	f.k = k
	b, err := d.Store.Binding(ctx, k.nodeName)
	if errors.Is(err, store.ErrNotFound) {
		b = nil
	} else if err != nil {
		return Decision{}, false, fmt.Errorf("approver: binding of %s: %w", k.nodeName, err)
	}
	f.b = b
	return Decision{}, false, nil
}

// ruleOwnerAttested denies every CSR for a node whose owner is not
// attested.
func ruleOwnerAttested(_ context.Context, d *Decider, f *facts) (Decision, bool, error) {
	ok, why, last := f.b.Attested(d.Clock(), d.staleAfter(f.b.Pool))
	if ok {
		return Decision{}, false, nil
	}
	return Decision{Action: Deny, Reason: why, NodeName: f.k.nodeName, Record: f.b.RecordID,
		Message: fmt.Sprintf("node %s is not attested (%s since %s): nodeproof approves its certificates again once it passes a re-attestation", f.k.nodeName, why, last.UTC().Format(time.RFC3339))}, true, nil
}

// ruleServing decides a serving CSR on the owner's records.
func ruleServing(ctx context.Context, d *Decider, f *facts) (Decision, bool, error) {
	recs, err := f.records(ctx, d)
	if err != nil {
		return Decision{}, false, err
	}
	var owned []*store.Record
	for _, r := range recs {
		if f.b != nil && r.Identity == f.b.Identity {
			owned = append(owned, r)
		}
	}
	return d.serving(f.k, owned), true, nil
}
