// Package store keeps what nodeproof's server replicas and the CSR approver
// share: NodeAttestation records (what a successful attestation
// established, including the kubelet key it bound), single-use markers
// (a challenge answered, a config token spent), node bindings (which
// evidence identity owns a node name: the identity that enrolled first),
// bans (identities an operator revoked: refused everything, under any name,
// until lifted) and each node name's history (the bindings released from
// it, and an operator's adoption of a name nodeproof never owned).
//
// Ban and evict are different things: a ban (Ban, Revoke) belongs to the
// identity and outlives every release; a release (Release) frees a name —
// its binding goes to the name's history — and never lifts a ban.
//
// Backends: store/boltstore (embedded, on disk, for one host) and the
// Kubernetes backend (CRDs; with the approver). Both guarantee that a write
// has reached durable storage before it returns, so a record is never lost
// once its config token has been handed out.
package store

import (
	"context"
	"errors"
	"strings"
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
	// ErrRevoked: the identity is banned (or its binding revoked): it
	// enrols under no name and its records approve nothing.
	ErrRevoked = errors.New("identity revoked")
	// ErrPoolFixed: enrolling again named another pool than the
	// binding's; a node's pool is fixed by its enrolment.
	ErrPoolFixed = errors.New("node enrolled in another pool")
	// ErrEnrolmentCap: enrolling again, the identity holds its cap of
	// unexpired records for the name (EnrolOptions.MaxLive).
	ErrEnrolmentCap = errors.New("identity holds its cap of unexpired enrolments")
)

// MaxReleased is how many released bindings a node name's history keeps
// (the newest).
const MaxReleased = 16

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
	// configs, certificates. It mirrors the identity's Ban: set by Ban
	// (and Revoke), cleared only by Unban; a release keeps the ban.
	Revoked *Revocation `json:"revoked,omitempty"`
	// Status is what the node's attestations after its enrolment
	// established (re-attestations); see Attested.
	Status AttestationStatus `json:"status"`
	// UID is the NodeBinding object's uid with the kubernetes store (an
	// Event about the binding names it, so kubectl describe lists it);
	// empty with the embedded store. Read only: no store keeps it.
	UID string `json:"uid,omitempty"`
}

// Revocation is an operator's refusal of an identity, as its binding
// shows it.
type Revocation struct {
	At     time.Time `json:"at"`
	By     string    `json:"by,omitempty"`
	Reason string    `json:"reason,omitempty"`
}

// Ban is an operator's refusal of an identity (nodeproof revoke): while it
// stands the identity enrols under no name and in no pool (ErrRevoked),
// its binding, if it holds one, is Revoked (re-attestation, config fetches
// with tokens issued before, every CSR and report ownership are refused),
// and its records cannot be consumed (ErrRevoked). It outlives releases,
// restarts and leader changes; only Unban lifts it.
type Ban struct {
	// Identity is the banned evidence identity; Kind its kind.
	Identity string      `json:"identity"`
	Kind     attest.Kind `json:"kind,omitempty"`
	// NodeName is the name the identity held when it was banned ("" if
	// none).
	NodeName string `json:"nodeName,omitempty"`
	// At, By and Reason say when, who (the operator) and why.
	At     time.Time `json:"at"`
	By     string    `json:"by,omitempty"`
	Reason string    `json:"reason,omitempty"`
}

// Revocation is the ban as a binding shows it.
func (b *Ban) Revocation() *Revocation { return &Revocation{At: b.At, By: b.By, Reason: b.Reason} }

// Act is an operator's action: when, who, why. A zero At is the store's
// clock.
type Act struct {
	At     time.Time `json:"at"`
	By     string    `json:"by,omitempty"`
	Reason string    `json:"reason,omitempty"`
}

// Released is a binding an operator released, as the name's history keeps
// it.
type Released struct {
	Identity string      `json:"identity"`
	Kind     attest.Kind `json:"kind"`
	Pool     string      `json:"pool"`
	// CreatedAt is when the identity first enrolled under the name.
	CreatedAt time.Time `json:"createdAt"`
	// Revoked says whether the binding was revoked when released.
	Revoked bool `json:"revoked,omitempty"`
	// Act is the release: when, who, why.
	Act Act `json:"released"`
}

// NameHistory is what the store keeps of a node name besides its binding.
// A name with a history was nodeproof's (or was adopted): its Node stays
// nodeproof's — tainted while no identity holds the name — whatever the
// Node itself says. Histories do not expire.
type NameHistory struct {
	NodeName string `json:"nodeName"`
	// Released are the bindings released from the name, newest first, at
	// most MaxReleased.
	Released []Released `json:"released,omitempty"`
	// Adopted is an operator's adoption of a name whose Node existed
	// before nodeproof: a pool with requested names may then bind it.
	Adopted *Act `json:"adopted,omitempty"`
}

// AddReleased puts r first in h.Released, keeping at most MaxReleased.
func (h *NameHistory) AddReleased(r Released) {
	h.Released = append([]Released{r}, h.Released...)
	if len(h.Released) > MaxReleased {
		h.Released = h.Released[:MaxReleased]
	}
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
	// Audit, of a passed attempt, says which rules in audit mode would
	// have refused it and why (policy.FormatAudits: one "rule: Reason:
	// message" a line); empty when none would.
	Audit string `json:"audit,omitempty"`
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
	// Rejudged, when set, is when a change of the policy in force failed
	// the node's last passing attempt's claims without an attempt of the
	// node (mcs/rejudge): Passed is false, Reason and Message the refusing
	// rule's, and the attempt's fields (LastAttempt, Claims, Summary) stay
	// the attempt's. A later re-judge whose policy passes the claims again
	// clears it (Passed true again); any attempt of the node clears it.
	Rejudged time.Time `json:"rejudged,omitzero"`
}

// Bounds of a status's Audit and Message, whoever writes them (a
// re-attestation, a re-judge).
const (
	MaxStatusAudit   = 4096
	MaxStatusMessage = 1024
)

// StatusMessage is msg as a status keeps it: at most MaxStatusMessage
// bytes, cut on a character.
func StatusMessage(msg string) string {
	if len(msg) <= MaxStatusMessage {
		return msg
	}
	return strings.ToValidUTF8(msg[:MaxStatusMessage], "")
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
	// MaxLive, when above 0, with Again, caps the identity's unexpired
	// records for the name (those whose Expires is after the record's
	// CreatedAt): holding that many already is ErrEnrolmentCap
	// (ConflictLiveCap, their expiries in Live). Each enrolment mints a
	// bootstrap token: a machine must not mint them without bound.
	MaxLive int
	// Delivered, when set, names the single-use marker a delivered config
	// sets: a refusal an earlier answer to the same session may explain
	// reports whether it is set (EnrolConflict.Delivered).
	Delivered string
}

// Once is a single-use marker: Key may be set once until Expires.
type Once struct {
	Key     string
	Expires time.Time
}

// RecordReader reads the NodeAttestation records.
type RecordReader interface {
	// GetRecord returns a record by ID (ErrNotFound).
	GetRecord(ctx context.Context, id string) (*Record, error)
	// RecordsForNode returns the records for a node name, newest first,
	// expired ones included (callers decide). It reads an index, page by
	// page, with no upper bound: only the identity that owns the name can
	// add records for it (Enrol), so no third party can grow the list.
	RecordsForNode(ctx context.Context, nodeName string) ([]*Record, error)
}

// Records are the NodeAttestation records: written by the server
// (CreateRecord, or Bindings.Enrol), consumed by the approver.
type Records interface {
	RecordReader
	// CreateRecord stores r and, in the same atomic and durable write, sets
	// every marker in once (a session answered; an instance enrolled). If
	// any is already set it returns ErrUsed and stores nothing; an existing
	// ID gives ErrExists. Calling it again for a record it already stored
	// gives ErrUsed or ErrExists; after a call that was cut off (a crash),
	// calling it again with the same record completes it.
	CreateRecord(ctx context.Context, r *Record, once ...Once) error
	// ConsumeRecord marks a record as having approved the CSR by;
	// ErrConsumed if it already did, ErrNotFound if there is none,
	// ErrRevoked if its identity is banned.
	ConsumeRecord(ctx context.Context, id, by string, at time.Time) error
}

// BindingReader reads the node names' owners.
type BindingReader interface {
	// Binding returns the binding of a node name (ErrNotFound).
	Binding(ctx context.Context, nodeName string) (*Binding, error)
	// BindingOf returns the binding an identity holds (ErrNotFound).
	BindingOf(ctx context.Context, identity string) (*Binding, error)
	// Bindings lists every binding, page by page.
	Bindings(ctx context.Context) ([]*Binding, error)
}

// Bindings are the node names' owners as the server writes them:
// enrolment (Enrol, which also writes the record and its markers) and
// the status of the attestations after it.
type Bindings interface {
	BindingReader
	// Enrol stores r as an enrolment of r.Identity under r.NodeName,
	// with its markers, and binds the name to the identity. A banned
	// identity is ErrRevoked, whatever the name and options. Then:
	//   - first enrolment (o.Again false): the name must be unbound
	//     (ErrNameTaken if another identity holds it) and the identity
	//     bound to no name (ErrIdentityEnrolled); the binding is created;
	//   - again (o.Again): the name must be bound to r.Identity
	//     (ErrNameTaken if to another; a binding released meanwhile is
	//     enrolled as a first one) with r's kubelet key unless
	//     o.ReplaceKey (ErrIdentityEnrolled), in the binding's pool
	//     (ErrPoolFixed), not revoked (ErrRevoked), and, with o.MaxLive,
	//     below its cap of unexpired records for the name
	//     (ErrEnrolmentCap); the binding is updated.
	// A refusal is a *EnrolConflict (its Reason, the binding and the
	// record stored under r.ID, as the refusing write saw them), which
	// unwraps to the error named above (ErrUsed, ErrExists when a marker
	// is set or the record exists).
	// Completing a call that was cut off (a crash) with the same record
	// succeeds. On any error nothing this call wrote is kept, except where
	// the outcome of a write is unknown; then, as with CreateRecord, the
	// markers stay (the safe direction).
	Enrol(ctx context.Context, r *Record, o EnrolOptions, once ...Once) error
	// UpdateStatus changes the attestation status of nodeName's binding,
	// which must be identity's (ErrNameTaken otherwise, ErrNotFound when
	// there is none), with fn, in one write that cannot lose a concurrent
	// one (fn may run again on a fresh read). It returns the binding as
	// written.
	UpdateStatus(ctx context.Context, nodeName, identity string, fn func(*Binding) error) (*Binding, error)
}

// BanReader reads the bans.
type BanReader interface {
	// BanOf returns an identity's ban (ErrNotFound).
	BanOf(ctx context.Context, identity string) (*Ban, error)
	// Bans lists every ban.
	Bans(ctx context.Context) ([]*Ban, error)
}

// Bans are the operators' refusals of identities.
type Bans interface {
	BanReader
	// Revoke bans the identity bound to nodeName (ErrNotFound when none;
	// Ban with that name, reason and time) and returns its binding, now
	// revoked.
	Revoke(ctx context.Context, nodeName, reason string, at time.Time) (*Binding, error)
	// Ban bans b.Identity — or, when it is empty, the identity bound to
	// b.NodeName (ErrNotFound when none) — and revokes its binding, if it
	// holds one, before it returns. Banning again keeps the first ban. It
	// returns the ban as stored.
	Ban(ctx context.Context, b Ban) (*Ban, error)
	// Unban lifts an identity's ban and clears its binding's revocation
	// (ErrNotFound when it is not banned), and returns the ban lifted.
	Unban(ctx context.Context, identity string) (*Ban, error)
}

// NameReader reads the node names' histories.
type NameReader interface {
	// History returns a node name's history (ErrNotFound when it has
	// none: never released, never adopted).
	History(ctx context.Context, nodeName string) (*NameHistory, error)
	// Histories lists every name's history.
	Histories(ctx context.Context) ([]*NameHistory, error)
}

// Names are what frees and claims a node name, and the history it
// leaves: releases and adoptions.
type Names interface {
	NameReader
	// Release deletes the binding of a node name and returns it, so the
	// name may be taken and the identity — unless banned — enrol again
	// (ErrNotFound). The binding goes to the name's history (with how,
	// when given: who and why); a revoked binding's revocation becomes
	// the identity's ban if it had none (a hand-set revocation survives
	// the release too).
	Release(ctx context.Context, nodeName string, how ...Act) (*Binding, error)
	// Adopt records an operator's adoption of a node name (see
	// NameHistory.Adopted) and returns the name's history; adopting again
	// keeps the first adoption.
	Adopt(ctx context.Context, nodeName string, how Act) (*NameHistory, error)
}

// MarkerReader reads the single-use markers.
type MarkerReader interface {
	// IsUsed reports whether an unexpired marker is set for key, without
	// setting it.
	IsUsed(ctx context.Context, key string) (bool, error)
}

// Markers are the single-use markers (a session answered, a token
// spent).
type Markers interface {
	MarkerReader
	// UseOnce sets a single-use marker valid until expires; ErrUsed if set.
	UseOnce(ctx context.Context, key string, expires time.Time) error
	// ReleaseOnce clears a marker that UseOnce set, when the use it guarded
	// did not happen (a response that could not be delivered).
	ReleaseOnce(ctx context.Context, key string) error
}

// Operator is what the operators' views and workflows (package operate)
// use of the store — every read, bans, names, and clearing a marker whose
// use did not happen (enroll --reset); never an enrolment, a record, a
// status or a marker set — and so what store/adminsock hands its
// workflows of a running server's store.
type Operator interface {
	RecordReader
	BindingReader
	Bans
	Names
	MarkerReader
	// ReleaseOnce clears a marker that UseOnce set, when the use it guarded
	// did not happen (a response that could not be delivered).
	ReleaseOnce(ctx context.Context, key string) error
	Close() error
}

// Store is the whole shared state: every role, garbage collection and
// closing. A consumer names the roles it uses (Records, Bindings, Bans,
// Names, Markers, their readers, Operator; Lineages and TokenIndex beside
// them), not Store. Implementations are safe for concurrent use.
type Store interface {
	Records
	Bindings
	Bans
	Names
	Markers
	// GC deletes records and markers that expired before now and returns how
	// many it deleted.
	GC(ctx context.Context, now time.Time) (int, error)
	Close() error
}
