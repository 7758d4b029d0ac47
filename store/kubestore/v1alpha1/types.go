package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeAttestation is what one successful attestation established: the node
// it names, the evidence, and the kubelet key the evidence bound. The
// approver approves a kubelet CSR only with a live, unconsumed
// NodeAttestation whose key the CSR carries.
//
// The object's name is the record ID. The spec cannot change once created;
// the status records the one CSR the attestation was consumed by, and cannot
// change again once it does.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=nodeproof
// +kubebuilder:subresource:status
// +kubebuilder:selectablefield:JSONPath=.spec.nodeName
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=".spec.nodeName"
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=".spec.pool"
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=".spec.kind"
// +kubebuilder:printcolumn:name="Consumed",type=date,JSONPath=".status.consumedAt"
// +kubebuilder:printcolumn:name="Consumed-By",type=string,JSONPath=".status.consumedBy",priority=1
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=".spec.expires",priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="the name (record ID) must be a DNS label: at most 63 characters"
type NodeAttestation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
	Spec NodeAttestationSpec `json:"spec"`
	// +optional
	Status NodeAttestationStatus `json:"status,omitempty"`
}

// NodeAttestationSpec is a store.Record without its ID (the object's name)
// and consumption (the status).
type NodeAttestationSpec struct {
	// NodeName is the node the record is for: the approver matches a CSR's
	// common name system:node:<nodeName> against it. A DNS subdomain, as
	// node names are. Selectable: --field-selector spec.nodeName=NAME.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// Pool is the MachineConfigPool the node attested for.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Pool string `json:"pool"`
	// Kind is the kind of evidence that made the record (attest.Kind).
	// +required
	// +kubebuilder:validation:Enum=tpm;gcp;aws;gce-vtpm;aws-nitrotpm;azure-vtpm
	Kind string `json:"kind"`
	// Identity is what the evidence identified (an EK, an instance ID).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Identity string `json:"identity,omitempty"`
	// KubeletKeySHA256 is the SHA-256 of the kubelet public key (PKIX DER)
	// that the evidence bound, as 64 lower-case hex digits (the output of
	// `openssl pkey -pubin -outform der | sha256sum`): the only key a CSR for
	// this record may carry.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	KubeletKeySHA256 string `json:"kubeletKeySHA256"`
	// Addresses the evidence attested (for kubelet serving CSRs).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Addresses []string `json:"addresses,omitempty"`
	// BootstrapTokenID names the per-node bootstrap token issued with the
	// config, when there is one: the CSR's requester must be
	// system:bootstrap:<bootstrapTokenID>.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-z0-9]{6}$`
	BootstrapTokenID string `json:"bootstrapTokenID,omitempty"`
	// Summary is a short human description of the evidence.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Summary string `json:"summary,omitempty"`
	// CreatedAt is when the attestation succeeded.
	// +required
	CreatedAt metav1.MicroTime `json:"createdAt"`
	// Expires is when the record stops approving CSRs; garbage collection
	// deletes it after that.
	// +required
	Expires metav1.MicroTime `json:"expires"`
}

// NodeAttestationStatus says whether the record was consumed: it approved
// one CSR. Once set, it cannot change.
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.consumedAt) || self == oldSelf",message="a consumed record's status is immutable"
type NodeAttestationStatus struct {
	// ConsumedAt is when a CSR was approved with this record.
	// +optional
	ConsumedAt *metav1.MicroTime `json:"consumedAt,omitempty"`
	// ConsumedBy names what consumed it (the CSR).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	ConsumedBy string `json:"consumedBy,omitempty"`
}

// NodeAttestationList is a list of NodeAttestations.
//
// +kubebuilder:object:root=true
type NodeAttestationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeAttestation `json:"items"`
}

// AttestationMarker is a single-use marker: a session answered, a config
// token spent, an instance enrolled. Its name is MarkerName(spec.key), so
// only one can exist per key; it stops counting at spec.expires (and
// garbage collection deletes it after that).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=nodeproof
// +kubebuilder:printcolumn:name="Key",type=string,JSONPath=".spec.key"
// +kubebuilder:printcolumn:name="Record",type=string,JSONPath=".spec.recordID"
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=".spec.expires"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type AttestationMarker struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
	Spec AttestationMarkerSpec `json:"spec"`
}

// AttestationMarkerSpec is a store.Once, and the record it was set with.
type AttestationMarkerSpec struct {
	// Key is the marker's key, as the store was given it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Key string `json:"key"`
	// Expires is when the marker stops counting as set.
	// +required
	Expires metav1.MicroTime `json:"expires"`
	// RecordID names the NodeAttestation created together with the marker;
	// empty for a marker set on its own (a config token spent).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	RecordID string `json:"recordID,omitempty"`
}

// AttestationMarkerList is a list of AttestationMarkers.
//
// +kubebuilder:object:root=true
type AttestationMarkerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AttestationMarker `json:"items"`
}

// MarkerName is the name of the AttestationMarker for a marker key: the
// SHA-256 of the key in hex (64 characters, a valid object name whatever
// the key holds).
func MarkerName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// NodeBinding is the ownership of a node name by the evidence identity
// that enrolled with it first (store.Binding). Its name is the node name,
// so the API server's uniqueness of names decides which of two identities
// racing for a name holds it. While it exists, no other identity gets a
// NodeAttestation for the name, and the approver approves client
// certificates for the name only with the binding's kubelet key. An
// operator releases the name by deleting the object (`nodeproof release
// NODE`). The label nodeproof.io/identity (IdentityLabel) indexes it by
// identity.
//
// The status is the node's attestation over its life (re-attestations):
// the server writes it; the approver's node controller reads it to set the
// Node's Attested condition and the nodeproof.io/unattested taint. The
// printer columns show the enrolment from the spec (Kind, Pool, Enrolled)
// as soon as the binding exists; the status's (Passed, Reason,
// Last-Success) fill at the node's first re-attestation, at its first boot
// (the enrolment's own create cannot write a status subresource, and
// writing it apart would cost every machine one more API call).
// spec.revoked mirrors the identity's IdentityBan (`nodeproof revoke`); set
// by hand (GitOps) it refuses the identity everything as well, and
// releasing the binding turns it into the identity's IdentityBan.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=nodeproof
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=".spec.kind"
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=".spec.pool"
// +kubebuilder:printcolumn:name="Enrolled",type=date,JSONPath=".spec.enrolledAt"
// +kubebuilder:printcolumn:name="Passed",type=boolean,JSONPath=".status.passed"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=".status.reason"
// +kubebuilder:printcolumn:name="Last-Success",type=date,JSONPath=".status.lastSuccess"
// +kubebuilder:printcolumn:name="Revoked",type=date,JSONPath=".spec.revoked.at"
// +kubebuilder:printcolumn:name="Identity",type=string,JSONPath=".spec.identity",priority=1
// +kubebuilder:printcolumn:name="Record",type=string,JSONPath=".spec.recordID",priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.spec.nodeName",message="the name is the node name"
type NodeBinding struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	// +kubebuilder:validation:XValidation:rule="self.nodeName == oldSelf.nodeName && self.identity == oldSelf.identity && self.kind == oldSelf.kind",message="a binding's node name, identity and kind are immutable: delete it to release the name"
	Spec NodeBindingSpec `json:"spec"`
	// +optional
	Status NodeBindingStatus `json:"status,omitempty"`
}

// Revocation is an operator's refusal of an identity.
type Revocation struct {
	// At is when it was revoked.
	// +required
	At metav1.MicroTime `json:"at"`
	// By is who revoked it (the operator).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	By string `json:"by,omitempty"`
	// Reason says why, for people.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
}

// NodeBindingStatus is store.AttestationStatus: the outcome of the node's
// latest attestation after its enrolment.
type NodeBindingStatus struct {
	// +optional
	LastAttempt *metav1.MicroTime `json:"lastAttempt,omitempty"`
	// +optional
	LastSuccess *metav1.MicroTime `json:"lastSuccess,omitempty"`
	// Passed is the last attempt's outcome: unset until the first
	// attempt after enrolment, then true or false (kubectl's PASSED
	// column shows false, not a blank).
	// +optional
	Passed *bool `json:"passed,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Reason string `json:"reason,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
	// Audit, of a passed attempt, says which policy rules in audit mode
	// would have refused it and why, one "rule: Reason: message" a line.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Audit string `json:"audit,omitempty"`
	// Boots counts the boots seen since enrolment.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Boots int64 `json:"boots,omitempty"`
	// ResetCount and RestartCount are the last TPM quote's clock info.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ResetCount int64 `json:"resetCount,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	RestartCount int64 `json:"restartCount,omitempty"`
	// SessionIssuedAt is when the last attempt's session was issued.
	// +optional
	SessionIssuedAt *metav1.MicroTime `json:"sessionIssuedAt,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Summary string `json:"summary,omitempty"`
	// Claims are the last attempt's claims (attest.Claims), an object
	// kubectl describe shows field by field; at most MaxClaims bytes of
	// JSON (a larger set is not kept: Summary still says what passed).
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:validation:MaxProperties=32
	Claims *apiextensionsv1.JSON `json:"claims,omitempty"`
	// Rejudged is when a change of the policy in force failed the last
	// passing attempt's claims (Passed false, the refusing rule's Reason
	// and Message) without an attempt of the node.
	// +optional
	Rejudged *metav1.MicroTime `json:"rejudged,omitempty"`
}

// NodeBindingSpec is a store.Binding.
type NodeBindingSpec struct {
	// NodeName is the bound node name (and the object's name).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// Pool is the pool of the enrolment.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool"`
	// Kind is the kind of evidence of the owning identity.
	// +required
	// +kubebuilder:validation:Enum=tpm;gcp;aws;gce-vtpm;aws-nitrotpm;azure-vtpm
	Kind string `json:"kind"`
	// Identity is the owning evidence identity (an EK hash, a cloud
	// instance).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Identity string `json:"identity"`
	// KubeletKeySHA256 is the kubelet key the enrolment bound, as 64
	// lower-case hex digits.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	KubeletKeySHA256 string `json:"kubeletKeySHA256"`
	// RecordID names the NodeAttestation of the enrolment that made the
	// binding or last enrolled under it again.
	// +required
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	RecordID string `json:"recordID"`
	// CreatedAt is when the identity first enrolled under the name.
	// +required
	CreatedAt metav1.MicroTime `json:"createdAt"`
	// EnrolledAt is when it last enrolled (a first enrolment, or again).
	// +optional
	EnrolledAt *metav1.MicroTime `json:"enrolledAt,omitempty"`
	// Revoked, when set, refuses the identity attestations, configs and
	// certificates: it mirrors the identity's IdentityBan, and outlives
	// the binding as that ban.
	// +optional
	Revoked *Revocation `json:"revoked,omitempty"`
}

// NodeBindingList is a list of NodeBindings.
//
// +kubebuilder:object:root=true
type NodeBindingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeBinding `json:"items"`
}

// IdentityBan is an operator's ban of an evidence identity (store.Ban):
// while it exists the identity enrols under no node name and in no pool,
// its NodeBinding (if any) is revoked, and its NodeAttestations approve
// nothing. Its name is BanName(spec.identity), so an identity has at most
// one. `nodeproof revoke` creates it; deleting it (`nodeproof unban`)
// lifts the ban.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=nodeproof
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=".spec.nodeName"
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=".spec.kind"
// +kubebuilder:printcolumn:name="By",type=string,JSONPath=".spec.by"
// +kubebuilder:printcolumn:name="At",type=date,JSONPath=".spec.at"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=".spec.reason"
// +kubebuilder:printcolumn:name="Identity",type=string,JSONPath=".spec.identity",priority=1
// +kubebuilder:validation:XValidation:rule="self.metadata.name.startsWith('ban-')",message="the name is BanName(spec.identity)"
type IdentityBan struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: delete the ban to lift it"
	Spec IdentityBanSpec `json:"spec"`
}

// IdentityBanSpec is a store.Ban.
type IdentityBanSpec struct {
	// Identity is the banned evidence identity.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Identity string `json:"identity"`
	// Kind is its kind of evidence, when known.
	// +optional
	// +kubebuilder:validation:Enum=tpm;gcp;aws;gce-vtpm;aws-nitrotpm;azure-vtpm
	Kind string `json:"kind,omitempty"`
	// NodeName is the name the identity held when banned.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`
	// At is when it was banned.
	// +required
	At metav1.MicroTime `json:"at"`
	// By is who banned it (the operator).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	By string `json:"by,omitempty"`
	// Reason says why.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
}

// IdentityBanList is a list of IdentityBans.
//
// +kubebuilder:object:root=true
type IdentityBanList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IdentityBan `json:"items"`
}

// BanName is the name of an identity's IdentityBan: "ban-" and the
// SHA-256 of the identity in hex.
func BanName(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return "ban-" + hex.EncodeToString(sum[:])
}

// NodeNameHistory is what nodeproof keeps of a node name besides its
// NodeBinding (store.NameHistory): the bindings released from it, and an
// operator's adoption of a name whose Node existed before nodeproof. Its
// name is the node name. A name with a history stays nodeproof's: the
// approver's node controller keeps its Node tainted while no identity holds
// the name, whatever the Node says of itself.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=nodeproof
// +kubebuilder:printcolumn:name="Last-Owner",type=string,JSONPath=".spec.released[0].identity"
// +kubebuilder:printcolumn:name="Last-Released",type=date,JSONPath=".spec.released[0].released.at"
// +kubebuilder:printcolumn:name="Adopted",type=date,JSONPath=".spec.adopted.at"
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.spec.nodeName",message="the name is the node name"
type NodeNameHistory struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	// +kubebuilder:validation:XValidation:rule="self.nodeName == oldSelf.nodeName",message="the node name is immutable"
	Spec NodeNameHistorySpec `json:"spec"`
}

// NodeNameHistorySpec is a store.NameHistory.
type NodeNameHistorySpec struct {
	// NodeName is the node name (and the object's name).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// Released are the bindings released from the name, newest first.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Released []ReleasedBinding `json:"released,omitempty"`
	// Adopted is an operator's adoption of the name.
	// +optional
	Adopted *OperatorAct `json:"adopted,omitempty"`
}

// ReleasedBinding is a released NodeBinding (store.Released).
type ReleasedBinding struct {
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Identity string `json:"identity"`
	// +required
	// +kubebuilder:validation:Enum=tpm;gcp;aws;gce-vtpm;aws-nitrotpm;azure-vtpm
	Kind string `json:"kind"`
	// +required
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool"`
	// CreatedAt is when the identity first enrolled under the name.
	// +required
	CreatedAt metav1.MicroTime `json:"createdAt"`
	// Revoked says whether the binding was revoked when released.
	// +optional
	Revoked bool `json:"revoked,omitempty"`
	// Released is the release.
	// +required
	Released OperatorAct `json:"released"`
}

// OperatorAct is an operator's action (store.Act).
type OperatorAct struct {
	// +required
	At metav1.MicroTime `json:"at"`
	// +optional
	// +kubebuilder:validation:MaxLength=256
	By string `json:"by,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
}

// NodeNameHistoryList is a list of NodeNameHistories.
//
// +kubebuilder:object:root=true
type NodeNameHistoryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeNameHistory `json:"items"`
}

// Labels that index objects for label selectors (a label value holds at
// most 63 characters, so long values are hashed: LabelValue).
const (
	// IdentityLabel indexes NodeBindings by identity.
	IdentityLabel = "nodeproof.io/identity"
	// NodeLabel indexes NodeAttestations by node name.
	NodeLabel = "nodeproof.io/node"
)

// LabelValue is the label value indexing s: 56 hex digits of its SHA-256
// (224 bits; readers compare the spec field itself, never trusting a
// selector alone).
func LabelValue(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:28])
}

// MaxClaims bounds NodeBindingStatus.Claims (bytes of JSON).
const MaxClaims = 128 << 10
