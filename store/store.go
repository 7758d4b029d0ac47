// Package store keeps what nodeproof's server replicas and the CSR approver
// share: NodeAttestation records (what a successful attestation
// established, including the kubelet key it bound), single-use markers
// (a challenge answered, a config token spent), and node bindings (which
// evidence identity owns a node name: the identity that enrolled first).
//
// Backends: store/boltstore (embedded, on disk, for one host) and the
// Kubernetes backend (CRDs; with the approver). Both guarantee that a write
// has reached durable storage before it returns, so a record is never lost
// once its config token has been handed out.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// Errors a Store returns; test with errors.Is.
var (
	// ErrUsed: a single-use marker was already set (a replayed challenge, a
	// spent token, a second enrolment).
	ErrUsed = errors.New("already used")
	// ErrNotFound: no such record.
	ErrNotFound = errors.New("not found")
	// ErrConsumed: the record already approved a CSR.
	ErrConsumed = errors.New("record already consumed")
	// ErrExists: a record with that ID exists.
	ErrExists = errors.New("record exists")
	// ErrNameTaken: the node name is bound to another identity.
	ErrNameTaken = errors.New("node name bound to another identity")
	// ErrIdentityEnrolled: the identity is already enrolled (under
	// another node name, or with another kubelet key).
	ErrIdentityEnrolled = errors.New("identity already enrolled")
)

// Never is the expiry of what does not expire (a binding's identity
// marker).
var Never = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// Record is a NodeAttestation.
type Record struct {
	// ID is unique and random; config tokens name it.
	ID string `json:"id"`
	// NodeName is the node the record is for: the approver matches a
	// CSR's CN system:node:<NodeName> against it.
	NodeName string `json:"nodeName"`
	Pool     string `json:"pool"`
	// Kind and Identity say what evidence made the record.
	Kind     attest.Kind `json:"kind"`
	Identity string      `json:"identity"`
	// KubeletKeySHA256 is the SHA-256 of the kubelet public key (PKIX DER)
	// that the evidence bound: the only key a CSR for this record may carry.
	KubeletKeySHA256 []byte `json:"kubeletKeySHA256"`
	// Addresses the evidence attested (for serving CSRs).
	Addresses []string `json:"addresses,omitempty"`
	// BootstrapTokenID names the per-node Kubernetes bootstrap token issued
	// with the config, when there is one: the CSR's requester must be
	// system:bootstrap:<BootstrapTokenID>.
	BootstrapTokenID string `json:"bootstrapTokenID,omitempty"`
	// BootstrapTokenSecret is that token's secret, in memory only: set
	// when the token is issued (for the config token, which carries it
	// sealed to the node the kubeconfig goes to anyway) and, at fetch,
	// from the config token, so the kubeconfig is built without reading
	// the token's Secret back. Never stored.
	BootstrapTokenSecret string `json:"-"`
	// Summary is a short human description of the evidence (EK trust,
	// Secure Boot, boot digests) for `kubectl describe`-style output.
	Summary string `json:"summary,omitempty"`

	CreatedAt time.Time `json:"createdAt"`
	Expires   time.Time `json:"expires"`
	// ConsumedAt and ConsumedBy are set once a CSR was approved with it.
	ConsumedAt *time.Time `json:"consumedAt,omitempty"`
	ConsumedBy string     `json:"consumedBy,omitempty"`
}

// Binding is the ownership of a node name by the evidence identity that
// enrolled with it first. While it exists no other identity gets a record
// (and so a config or a kubelet certificate) for the name, and the identity
// is enrolled under no other name; only its kubelet key is approved.
// Bindings do not expire: an operator releases them (Release).
type Binding struct {
	// NodeName is the bound name.
	NodeName string `json:"nodeName"`
	// Pool, Kind and Identity are the owning enrolment's.
	Pool     string      `json:"pool"`
	Kind     attest.Kind `json:"kind"`
	Identity string      `json:"identity"`
	// KubeletKeySHA256 is the kubelet key the enrolment bound: re-enrolling
	// needs a proof of its possession, and the approver approves client
	// certificates for no other key.
	KubeletKeySHA256 []byte `json:"kubeletKeySHA256"`
	// RecordID is the record of the enrolment that made the binding or
	// last enrolled under it again.
	RecordID string `json:"recordID"`
	// CreatedAt is when the identity first enrolled under the name;
	// EnrolledAt when it last did (enrolling again moves it).
	CreatedAt  time.Time `json:"createdAt"`
	EnrolledAt time.Time `json:"enrolledAt"`
	// Revoked, when set, refuses the identity everything — attestations,
	// configs, certificates — until an operator releases the name.
	Revoked *Revocation `json:"revoked,omitempty"`
	// Status is what the node's attestations after its enrolment
	// established (re-attestations); see Attested.
	Status AttestationStatus `json:"status"`
}

// Revocation is an operator's refusal of an identity.
type Revocation struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// AttestationStatus is the outcome of a node's latest attestation after
// its enrolment. The zero value: none yet (the enrolment is the last one).
type AttestationStatus struct {
	// LastAttempt is when the identity last attested, passed or not.
	LastAttempt time.Time `json:"lastAttempt"`
	// LastSuccess is when it last passed.
	LastSuccess time.Time `json:"lastSuccess"`
	// Passed is the last attempt's outcome; Reason (an attest.Reason) and
	// Message say why it failed.
	Passed  bool   `json:"passed"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Boots counts the boots seen since enrolment (a TPM's reset count
	// changing between attestations); ResetCount and RestartCount are the
	// last quote's (TPMS_CLOCK_INFO), when the evidence is a TPM's.
	Boots        int64 `json:"boots"`
	ResetCount   int64 `json:"resetCount,omitempty"`
	RestartCount int64 `json:"restartCount,omitempty"`
	// SessionIssuedAt is when the session of the last attempt was issued:
	// a re-attestation answering an older session (or the same one again)
	// is refused, so a captured answer cannot be replayed to refresh it.
	SessionIssuedAt time.Time `json:"sessionIssuedAt"`
	// Summary is the last attempt's evidence in one line; Claims its
	// claims as JSON (for `nodeproof policy check --against-records`).
	Summary string `json:"summary,omitempty"`
	Claims  []byte `json:"claims,omitempty"`
}

// Attested says whether a binding's node is attested at now, given how
// long an attestation stays fresh: not revoked, and its latest attestation
// — a later re-attestation, or else the enrolment — passed no longer than
// fresh ago. It returns the reason when not: "Revoked",
// attest.ReasonAttestationFailed's or attest.ReasonAttestationStale's.
func (b *Binding) Attested(now time.Time, fresh time.Duration) (ok bool, reason attest.Reason, last time.Time) {
	if b.Revoked != nil {
		return false, attest.ReasonRevoked, b.Revoked.At
	}
	last = b.EnrolledAt
	if b.Status.LastAttempt.After(b.EnrolledAt) {
		if !b.Status.Passed {
			return false, attest.ReasonAttestationFailed, b.Status.LastAttempt
		}
		last = b.Status.LastSuccess
	}
	if now.Sub(last) > fresh {
		return false, attest.ReasonAttestationStale, last
	}
	return true, "", last
}

// EnrolOptions say what kind of enrolment Enrol writes.
type EnrolOptions struct {
	// Again enrols an identity already bound to the record's node name
	// once more: the binding is kept (its record ID updated). Without
	// ReplaceKey the record must bind the binding's kubelet key.
	Again bool
	// ReplaceKey, with Again, binds the record's kubelet key in place of
	// the binding's (a pool that re-enrols reinstalled machines always).
	ReplaceKey bool
}

// Once is a single-use marker: Key may be set once until Expires.
type Once struct {
	Key     string
	Expires time.Time
}

// Store is the shared state. Implementations are safe for concurrent use.
type Store interface {
	// Enrol stores r as an enrolment of r.Identity under r.NodeName,
	// with its markers, and binds the name to the identity:
	//   - first enrolment (o.Again false): the name must be unbound
	//     (ErrNameTaken if another identity holds it) and the identity
	//     bound to no name (ErrIdentityEnrolled); the binding is created;
	//   - again (o.Again): the name must be bound to r.Identity
	//     (ErrNameTaken if to another; a binding released meanwhile is
	//     enrolled as a first one) with r's kubelet key unless
	//     o.ReplaceKey (ErrIdentityEnrolled); the binding is updated.
	// Completing a call that was cut off (a crash) with the same record
	// succeeds. On any error nothing this call wrote is kept, except where
	// the outcome of a write is unknown; then, as with CreateRecord, the
	// markers stay (the safe direction).
	Enrol(ctx context.Context, r *Record, o EnrolOptions, once ...Once) error
	// Binding returns the binding of a node name (ErrNotFound).
	Binding(ctx context.Context, nodeName string) (*Binding, error)
	// BindingOf returns the binding an identity holds (ErrNotFound).
	BindingOf(ctx context.Context, identity string) (*Binding, error)
	// Release deletes the binding of a node name and returns it, so the
	// name may be taken and the identity enrol again (ErrNotFound).
	Release(ctx context.Context, nodeName string) (*Binding, error)
	// Bindings lists every binding, page by page.
	Bindings(ctx context.Context) ([]*Binding, error)
	// UpdateStatus changes the attestation status of nodeName's binding,
	// which must be identity's (ErrNameTaken otherwise, ErrNotFound when
	// there is none), with fn, in one write that cannot lose a concurrent
	// one (fn may run again on a fresh read). It returns the binding as
	// written.
	UpdateStatus(ctx context.Context, nodeName, identity string, fn func(*Binding) error) (*Binding, error)
	// Revoke marks nodeName's binding revoked (ErrNotFound) and returns
	// it; revoking again keeps the first revocation.
	Revoke(ctx context.Context, nodeName, reason string, at time.Time) (*Binding, error)
	// CreateRecord stores r and, in the same atomic and durable write, sets
	// every marker in once (a session answered; an instance enrolled). If
	// any is already set it returns ErrUsed and stores nothing; an existing
	// ID gives ErrExists. Calling it again for a record it already stored
	// gives ErrUsed or ErrExists; after a call that was cut off (a crash),
	// calling it again with the same record completes it.
	CreateRecord(ctx context.Context, r *Record, once ...Once) error
	// GetRecord returns a record by ID (ErrNotFound).
	GetRecord(ctx context.Context, id string) (*Record, error)
	// RecordsForNode returns the records for a node name, newest first,
	// expired ones included (callers decide). It reads an index, page by
	// page, with no upper bound: only the identity that owns the name can
	// add records for it (Enrol), so no third party can grow the list.
	RecordsForNode(ctx context.Context, nodeName string) ([]*Record, error)
	// ConsumeRecord marks a record as having approved the CSR by;
	// ErrConsumed if it already did, ErrNotFound if there is none.
	ConsumeRecord(ctx context.Context, id, by string, at time.Time) error
	// UseOnce sets a single-use marker valid until expires; ErrUsed if set.
	UseOnce(ctx context.Context, key string, expires time.Time) error
	// ReleaseOnce clears a marker that UseOnce set, when the use it guarded
	// did not happen (a response that could not be delivered).
	ReleaseOnce(ctx context.Context, key string) error
	// IsUsed reports whether an unexpired marker is set for key, without
	// setting it.
	IsUsed(ctx context.Context, key string) (bool, error)
	// GC deletes records and markers that expired before now and returns how
	// many it deleted.
	GC(ctx context.Context, now time.Time) (int, error)
	Close() error
}
