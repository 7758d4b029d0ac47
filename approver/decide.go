package approver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
)

// Action is what a decision does to the CSR.
type Action string

// Actions.
const (
	Approve Action = "approve"
	Deny    Action = "deny"
	// Leave leaves the CSR pending: another approver may own it. The
	// reason is still reported (an event on the CSR, the metric).
	Leave Action = "leave"
)

// Decision is the outcome for one CSR.
type Decision struct {
	Action  Action
	Reason  attest.Reason
	Message string
	// Record is the NodeAttestation record the decision rests on, if any.
	Record string
	// NodeName is the node the CSR is for, when the CSR named one.
	NodeName string
	// Rule is the rule that decided (Rules).
	Rule string
}

// Store is what decisions read and write of the store: the records (one
// is consumed by an approval) and the bindings (read).
type Store interface {
	store.Records
	store.BindingReader
}

// Decider decides CSRs from the store's NodeAttestation records.
type Decider struct {
	// Store holds the records the server wrote. It may answer from a
	// watch (kubestore.Cached) when Fresh is set.
	Store Store
	// Fresh, when set, is Store without a cache: a denial is final, so a
	// decision to deny made on Store is made again on Fresh, and only a
	// denial there is written (a watch a moment behind, e.g. a re-enrolment
	// with a new kubelet key, must not deny a machine for good).
	Fresh Store
	// Clock tells the time (required).
	Clock func() time.Time
	// DenyUnattested denies kubelet CSRs without evidence (no record for
	// the name, expired records, a serving CSR whose record attested no
	// addresses, a CSR that is not what a kubelet sends), instead of
	// leaving them pending for another approver.
	DenyUnattested bool
	// StaleAfter is how long a node's last passed attestation stays fresh
	// in its pool (policy lifetime.staleAfter); nil means
	// DefaultStaleAfter for every pool.
	StaleAfter func(pool string) time.Duration
	// Lineages keeps the certificate lineages that decisions on Store
	// read and RecordIssued writes (required): the store's own, or e.g.
	// kubestore.Cached.LineagesWith, whose writes go through a client of
	// their own, so recording a machine's certificate does not spend the
	// rate limit its approval needs.
	Lineages store.Lineages
	// FreshLineages are the lineages read and written on Fresh (required
	// with Fresh): Fresh's own.
	FreshLineages store.Lineages
	// Tokens, when set, finds the records naming a bootstrap token
	// (kubestore.Cached, boltstore.Store): a CSR made with a token issued
	// for another node is denied, and a token's CSRs spend its node's
	// budget. Without it bootstrap tokens are not checked against nodes.
	// Decisions made again on Fresh do not read it.
	Tokens store.TokenIndex
}

// lineages is where decisions on st read lineages, and RecordIssued writes
// them.
func (d *Decider) lineages(st Store) (store.Lineages, error) {
	l := d.Lineages
	if d.Fresh != nil && st == d.Fresh && st != d.Store {
		l = d.FreshLineages
	}
	if l == nil {
		return nil, errors.New("approver: no certificate lineages (Decider.Lineages, and FreshLineages with Fresh)")
	}
	return l, nil
}

// DefaultStaleAfter is the freshness window when no policy says: three
// times the default re-attestation interval.
const DefaultStaleAfter = 3 * time.Hour

func (d *Decider) staleAfter(pool string) time.Duration {
	if d.StaleAfter == nil {
		return DefaultStaleAfter
	}
	return d.StaleAfter(pool)
}

// csrRef names a CSR in a record's ConsumedBy: name and UID, so a CSR
// deleted and recreated under the same name is another CSR.
func csrRef(csr *certv1.CertificateSigningRequest) string {
	return csr.Name + "/" + string(csr.UID)
}

// Decide decides csr by the approver's rules (Rules: each with what it
// checks, why, and every decision it can make), applied in order: the
// first rule that judges the CSR and decides it makes the decision, which
// names it (Decision.Rule). For a kubelet client CSR it consumes the
// record it approves with (store.ConsumeRecord), so the caller must write
// the approval; deciding again for the same CSR after a failed write
// finds the record consumed by this CSR and approves again (idempotent).
// An error is a store failure: retry later. With Fresh set, a denial
// decided on Store is decided again on Fresh, and that decision stands
// (except BootstrapTokenOtherNode, which rests on records, whose spec
// never changes: a cache that holds one is not behind on it).
//
// Lineages (and FreshLineages, with Fresh) are required: without them no
// CSR the node makes itself is decided (an error). With Tokens, bootstrap
// tokens are checked against the node their records name.
//
// Records are garbage-collected once they expire (the store's GC, in the
// server): a serving-certificate renewal after that finds no record and
// is NoAttestation, left pending for the cluster's own approver (or
// denied with DenyUnattested), like any CSR nodeproof has no evidence for.
func (d *Decider) Decide(ctx context.Context, csr *certv1.CertificateSigningRequest) (Decision, error) {
	dec, err := d.decide(ctx, csr)
	if err != nil || dec.Action != Deny || d.Fresh == nil || dec.Reason == attest.ReasonTokenOtherNode {
		return dec, err
	}
	fresh := *d
	fresh.Store, fresh.Fresh, fresh.Lineages, fresh.FreshLineages, fresh.Tokens = d.Fresh, nil, d.FreshLineages, nil, nil
	return fresh.decide(ctx, csr)
}

// rules is Rules, made once.
var rules = Rules()

func (d *Decider) decide(ctx context.Context, csr *certv1.CertificateSigningRequest) (Decision, error) {
	f := &facts{csr: csr}
	for _, r := range rules {
		if !r.judges(f) {
			continue
		}
		dec, decided, err := r.decide(ctx, d, f)
		if err != nil {
			return Decision{}, err
		}
		if decided {
			dec.Rule = r.Name
			return dec, nil
		}
	}
	// The last rule decides every client CSR, and the one before every
	// serving CSR; recognize passes no other.
	return Decision{}, fmt.Errorf("approver: no rule decided %s", csr.Name)
}

// tokenForOtherNode denies a CSR made with a bootstrap token that
// nodeproof issued for another node: the token's unexpired records
// (Tokens) all name other nodes. A token the index does not
// know (none, or a shared token no record names) is not judged here.
func (d *Decider) tokenForOtherNode(ctx context.Context, k *kubeletCSR) (Decision, bool, error) {
	id, ok := strings.CutPrefix(k.requester, BootstrapUserPrefix)
	if !ok || d.Tokens == nil {
		return Decision{}, false, nil
	}
	nodes, err := tokenNodes(ctx, d.Tokens, id, d.Clock())
	if err != nil || len(nodes) == 0 || slices.Contains(nodes, k.nodeName) {
		return Decision{}, false, err
	}
	return Decision{Action: Deny, Reason: attest.ReasonTokenOtherNode, NodeName: k.nodeName,
		Message: fmt.Sprintf("bootstrap token %s%s was issued for node %s, not %s", BootstrapUserPrefix, id, strings.Join(nodes, ", "), k.nodeName)}, true, nil
}

// tokenNodes returns the node names the unexpired records naming bootstrap
// token id are for (a token expires with its record), none when the index
// does not know the token.
func tokenNodes(ctx context.Context, idx store.TokenIndex, id string, now time.Time) ([]string, error) {
	recs, known, err := idx.RecordsForToken(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("approver: records of bootstrap token %s: %w", id, err)
	}
	var nodes []string
	for _, r := range recs {
		if known && now.Before(r.Expires) && !slices.Contains(nodes, r.NodeName) {
			nodes = append(nodes, r.NodeName)
		}
	}
	return nodes, nil
}

// notCurrentOwner denies a CSR the node made itself unless the client
// certificate that authenticated it is in the lineage of b's enrolment
// (check 3 of Decide).
func (d *Decider) notCurrentOwner(ctx context.Context, csr *certv1.CertificateSigningRequest, k *kubeletCSR, b *store.Binding) (Decision, bool, error) {
	base := Decision{Action: Deny, NodeName: k.nodeName, Record: b.RecordID}
	sum, why := RequesterCertificate(csr)
	if sum == nil {
		base.Reason = attest.ReasonNoClientCertificate
		base.Message = fmt.Sprintf("this CSR from %s carries no credential ID of an X.509 client certificate (%s): nodeproof cannot tell whose kubelet made it", k.requester, why)
		return base, true, nil
	}
	lins, err := d.lineages(d.Store)
	if err != nil {
		return Decision{}, false, err
	}
	lin, err := lins.Lineage(ctx, k.nodeName)
	if errors.Is(err, store.ErrNotFound) {
		lin = nil
	} else if err != nil {
		return Decision{}, false, fmt.Errorf("approver: lineage of %s: %w", k.nodeName, err)
	}
	if _, has := lin.Has(sum); has && lin.Of(b) {
		return Decision{}, false, nil
	}
	base.Reason = attest.ReasonNotCurrentOwner
	base.Message = fmt.Sprintf("this CSR from %s was made with the client certificate X509SHA256=%x, which is not one nodeproof saw issued to the kubelet of %s, the owner of node %s since %s (a certificate of a previous owner of the name, or of an earlier enrolment)",
		k.requester, sum, b.Identity, k.nodeName, b.CreatedAt.UTC().Format(time.RFC3339))
	return base, true, nil
}

// renewal decides a kubelet client CSR that the node itself makes (its
// certificate manager renewing the client certificate with a new key): it
// is approved when the node's identity owns the name, its attestation is
// fresh and the client certificate that made the request is in the
// lineage of the owner's enrolment (checked by the caller: Revoked,
// AttestationFailed, AttestationStale, NoClientCertificate,
// CertificateNotCurrentOwner otherwise). The new key is the kubelet's,
// made inside its certificate manager, and no evidence binds it; the
// request is authenticated by the node's current client certificate,
// which descends from the first one, whose key the evidence bound
// (docs/lifetime.md).
func (d *Decider) renewal(k *kubeletCSR, b *store.Binding) Decision {
	base := Decision{NodeName: k.nodeName}
	if b == nil {
		base.Reason, base.Message = attest.ReasonNoAttestation, "node "+k.nodeName+" is bound to no attested identity"
		return d.unattested(base)
	}
	base.Action, base.Record = Approve, b.RecordID
	base.Reason = attest.ReasonAttested(b.Kind)
	base.Message = fmt.Sprintf("nodeproof: renewal by node %s with a certificate of its owner's kubelet, whose %s attestation is fresh (%s)", k.nodeName, b.Kind, b.Identity)
	return base
}

// enrolled reports whether r is a record of b's enrolment: its identity,
// its kubelet key.
func enrolled(b *store.Binding, r *store.Record) bool {
	return b != nil && r.Identity == b.Identity && attest.Equal(r.KubeletKeySHA256, b.KubeletKeySHA256)
}

func (d *Decider) unattested(dec Decision) Decision {
	dec.Action = Leave
	if d.DenyUnattested {
		dec.Action = Deny
	}
	return dec
}

func (d *Decider) client(ctx context.Context, csr *certv1.CertificateSigningRequest, k *kubeletCSR, b *store.Binding, recs []*store.Record) (Decision, error) {
	now := d.Clock()
	ref := csrRef(csr)
	base := Decision{NodeName: k.nodeName}
	var live, matching, foreign []*store.Record
	for _, r := range recs {
		if now.Before(r.Expires) {
			live = append(live, r)
			if attest.Equal(r.KubeletKeySHA256, k.keySHA256) {
				if enrolled(b, r) {
					matching = append(matching, r)
				} else {
					foreign = append(foreign, r)
				}
			}
		}
	}
	switch {
	case len(recs) == 0:
		base.Reason, base.Message = attest.ReasonNoAttestation, "no NodeAttestation record for node "+k.nodeName
		return d.unattested(base), nil
	case len(live) == 0:
		base.Reason, base.Message = attest.ReasonRecordExpired, fmt.Sprintf("the %d NodeAttestation record(s) for node %s expired", len(recs), k.nodeName)
		return d.unattested(base), nil
	case len(matching) == 0 && len(foreign) > 0:
		owner := "no identity (released)"
		if b != nil {
			owner = b.Identity
		}
		base.Action, base.Reason, base.Record = Deny, attest.ReasonNodeNameTaken, foreign[0].ID
		base.Message = fmt.Sprintf("this CSR's key was attested by %s (NodeAttestation %s), which does not own node %s: it is bound to %s",
			foreign[0].Identity, foreign[0].ID, k.nodeName, owner)
		return base, nil
	case len(matching) == 0:
		base.Action, base.Reason = Deny, attest.ReasonKeyNotAttested
		base.Message = fmt.Sprintf("node %s attested another kubelet key (%d record(s)); this CSR's key was not bound by any evidence", k.nodeName, len(live))
		return base, nil
	}
	// A retry after the approval write failed: the record is already ours.
	for _, r := range matching {
		if r.ConsumedAt != nil && r.ConsumedBy == ref {
			return approval(base, r), nil
		}
	}
	for _, r := range matching { // newest first
		if r.ConsumedAt != nil {
			continue
		}
		if r.BootstrapTokenID != "" && k.requester != BootstrapUserPrefix+r.BootstrapTokenID {
			base.Action, base.Reason, base.Record = Deny, attest.ReasonRequesterMismatch, r.ID
			base.Message = fmt.Sprintf("NodeAttestation %s gave node %s the bootstrap token %s%s; this CSR was made by %q",
				r.ID, k.nodeName, BootstrapUserPrefix, r.BootstrapTokenID, k.requester)
			return base, nil
		}
		err := d.Store.ConsumeRecord(ctx, r.ID, ref, now)
		if errors.Is(err, store.ErrConsumed) {
			continue // another CSR won it a moment ago
		}
		if errors.Is(err, store.ErrRevoked) {
			// A ban the binding does not show yet (one written by hand,
			// before the server's watch revokes the binding).
			base.Action, base.Reason, base.Record = Deny, attest.ReasonRevoked, r.ID
			base.Message = fmt.Sprintf("NodeAttestation %s for node %s is of %s, which is banned", r.ID, k.nodeName, r.Identity)
			return base, nil
		}
		if err != nil {
			return Decision{}, fmt.Errorf("approver: consume record %s: %w", r.ID, err)
		}
		return approval(base, r), nil
	}
	base.Action, base.Reason, base.Record = Deny, attest.ReasonRecordConsumed, matching[0].ID
	base.Message = fmt.Sprintf("NodeAttestation %s for node %s already approved a certificate (%s); attest again for another", matching[0].ID, k.nodeName, matching[0].ConsumedBy)
	return base, nil
}

// approval names the evidence kind and the record.
func approval(d Decision, r *store.Record) Decision {
	d.Action, d.Record = Approve, r.ID
	d.Reason = attest.ReasonAttested(r.Kind)
	d.Message = fmt.Sprintf("nodeproof: kubelet key bound by %s evidence, NodeAttestation %s (%s)", r.Kind, r.ID, r.Summary)
	return d
}

func (d *Decider) serving(k *kubeletCSR, recs []*store.Record) Decision {
	base := Decision{NodeName: k.nodeName}
	if len(recs) == 0 {
		base.Reason, base.Message = attest.ReasonNoAttestation, "no NodeAttestation record for node "+k.nodeName
		return d.unattested(base)
	}
	r := recs[0]
	var names []string
	var ips []netip.Addr
	for _, a := range r.Addresses {
		if ip, err := netip.ParseAddr(a); err == nil {
			ips = append(ips, ip.Unmap())
		} else {
			names = append(names, a)
		}
	}
	// SANs of a kind the evidence cannot attest at all (GCP tokens carry
	// no IP address; vendor-CA TPM evidence no address) are for another
	// approver to judge: leave the CSR to it.
	switch {
	case len(k.dnsNames) > 0 && len(names) == 0, len(k.ips) > 0 && len(ips) == 0:
		kind := "DNS names"
		if len(k.ips) > 0 && len(ips) == 0 {
			kind = "IP addresses"
		}
		base.Reason, base.Record = attest.ReasonNoAddresses, r.ID
		base.Message = fmt.Sprintf("NodeAttestation %s (%s evidence) for node %s attested no %s to check the serving SANs against", r.ID, r.Kind, k.nodeName, kind)
		return d.unattested(base)
	}
	var missing []string
	for _, n := range k.dnsNames {
		if !slices.ContainsFunc(names, func(a string) bool { return strings.EqualFold(a, n) }) {
			missing = append(missing, n)
		}
	}
	for _, ip := range k.ips {
		want, _ := netip.ParseAddr(ip)
		if !slices.Contains(ips, want.Unmap()) {
			missing = append(missing, ip)
		}
	}
	if len(missing) > 0 {
		base.Action, base.Reason, base.Record = Deny, attest.ReasonSANNotAttested, r.ID
		base.Message = fmt.Sprintf("NodeAttestation %s for node %s attested %v, not %v", r.ID, k.nodeName, r.Addresses, missing)
		return base
	}
	d2 := approval(base, r)
	d2.Message = fmt.Sprintf("nodeproof: serving SANs attested by %s evidence, NodeAttestation %s", r.Kind, r.ID)
	return d2
}
