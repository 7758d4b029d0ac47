// Package api is the wire format of nodeproof's Machine Config Server: the
// JSON messages of /attest/v1 and the refusal body every 4xx/5xx carries.
// It imports no server code, so the node agent can use it (docs/protocol.md
// shows an example of each message).
package api

import (
	"encoding/json"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// Paths.
const (
	PathConfig    = "/config/"
	PathChallenge = "/attest/v1/challenge"
	PathVerify    = "/attest/v1/verify"
	PathHealthz   = "/healthz"
	// PathReport is where an agent reports why it failed (ReportRequest).
	PathReport = "/report/v1"
)

// Body size limits the server enforces.
const (
	MaxChallengeBody = 64 << 10
	// MaxVerifyBody leaves room for a 1 MiB event log in base64.
	MaxVerifyBody = 2 << 20
	// MaxReportBody bounds a failure report; MaxReportDetail its detail;
	// MaxUnauthenticatedReportDetail the detail of one the server records
	// as unauthenticated (anyone may send those).
	MaxReportBody                  = 8 << 10
	MaxReportDetail                = 1024
	MaxUnauthenticatedReportDetail = 256
)

// ReportStages are what a failure report may say failed.
var ReportStages = []string{"attestation", "config fetch", "re-attestation", "agent"}

// ReportRequest is a node's report of why it failed (POST /report/v1,
// secure port): the server writes it as a Kubernetes Event on the node
// name's NodeBinding, so an operator sees why a machine is stuck without
// its console. It is authenticated as well as the failure allows: with
// Session (the sealed session of the failed attempt, when the challenge
// got that far) and KubeletKeyProof over it, the report comes from the
// machine that holds the kubelet key that session bound, and counts as
// the node's own when that key is the one the node name is bound to;
// otherwise it is recorded as unauthenticated. It is never used for a
// decision.
type ReportRequest struct {
	Pool     string `json:"pool"`
	NodeName string `json:"nodeName"`
	// Stage is one of ReportStages.
	Stage string `json:"stage"`
	// Reason is the server's refusal reason, or what failed on the node
	// (letters, digits and . _ - only, at most 64).
	Reason string `json:"reason"`
	// Detail says more (at most MaxReportDetail bytes, or
	// MaxUnauthenticatedReportDetail when the report is recorded as
	// unauthenticated; cut, not refused).
	Detail          string `json:"detail,omitempty"`
	Session         string `json:"session,omitempty"`
	KubeletKeyProof []byte `json:"kubeletKeyProof,omitempty"`
}

// ReportResponse says how the report was recorded.
type ReportResponse struct {
	// Authenticated is "owner" (the sender proved the kubelet key the
	// node name is bound to), "session" (it proved its session's key, and
	// no identity owns the name: a machine that could not enrol) or
	// "none".
	Authenticated string `json:"authenticated"`
}

// ChallengeRequest opens an attestation: who the machine is, which pool it
// wants, and the kubelet public key its evidence will bind.
type ChallengeRequest struct {
	Kind attest.Kind `json:"kind"`
	Pool string      `json:"pool"`
	// KubeletPublicKey is the kubelet client key's public key, PKIX DER.
	KubeletPublicKey []byte `json:"kubeletPublicKey"`
	// NodeName is the name the machine asks for; used only when the pool's
	// policy takes requested names and the evidence names none.
	NodeName string `json:"nodeName,omitempty"`
	// Purpose is "enrol" (the default: the attestation releases a config)
	// or "reattest" (an enrolled node proving itself again: it releases
	// nothing, and names its node).
	Purpose attest.Purpose `json:"purpose,omitempty"`
	// Ticket is what the server's last verify gave this machine
	// (VerifyResponse.Ticket), brought back unchanged; opaque to the node.
	// A TPM's spares its next attestations the credential activation while
	// it keeps the same AK (docs/protocol.md).
	Ticket string `json:"ticket,omitempty"`
	// Request is the kind's own request (tpm.ChallengeRequest, …), on the
	// wire under the kind's name: {"kind":"tpm", …, "tpm":{…}}. The
	// server hands it to the kind's attest.Verifier unread.
	Request json.RawMessage `json:"-"`
}

// ChallengeResponse carries the sealed session and the kind's challenge.
type ChallengeResponse struct {
	// Session is opaque to the node; it sends it back with its evidence.
	Session string    `json:"session"`
	Expires time.Time `json:"expires"`
	// Kind is the kind of the challenge (the request's).
	Kind attest.Kind `json:"kind,omitempty"`
	// Challenge is the kind's challenge (tpm.Challenge: a credential and a
	// nonce; gcp.Challenge: the token's audience; …), on the wire under
	// the kind's name.
	Challenge json.RawMessage `json:"-"`
}

// VerifyRequest answers a challenge.
type VerifyRequest struct {
	Session string `json:"session"`
	// KubeletKeyProof proves the requester holds the kubelet key the
	// session bound: attest.SignKeyProof over Session. Optional; when sent
	// it must verify. It lets an AWS instance enrol again after a crash
	// cost it its config token (the document alone cannot: a stolen copy
	// would do the same).
	KubeletKeyProof []byte `json:"kubeletKeyProof,omitempty"`
	// Kind names the evidence, which travels under the kind's name
	// ({"session":…, "tpm":{…}}): the session's kind, which the server
	// holds to it.
	Kind     attest.Kind     `json:"-"`
	Evidence json.RawMessage `json:"-"`
}

// VerifyResponse carries the config token: present it as
// `Authorization: Bearer <token>` on GET /config/<pool>, once, before it
// expires.
type VerifyResponse struct {
	// ConfigToken fetches the config once, until Expires; empty for a
	// re-attestation.
	ConfigToken string    `json:"configToken,omitempty"`
	Expires     time.Time `json:"expires,omitempty"`
	NodeName    string    `json:"nodeName"`
	Pool        string    `json:"pool"`
	// Record names the NodeAttestation record the approver will use;
	// empty for a re-attestation.
	Record string `json:"record,omitempty"`
	// Reattest is set for a re-attestation that passed.
	Reattest *ReattestResult `json:"reattest,omitempty"`
	// Ticket, when set, is for the node to keep and send with its next
	// challenge (ChallengeRequest.Ticket), sealed by the server: a TPM's
	// says its AK is its EK's (it comes after a credential activation, and
	// with the AK kept the next attestations need none). Empty: keep the
	// one it has.
	Ticket string `json:"ticket,omitempty"`
}

// ReattestResult is what a passed re-attestation tells the node.
type ReattestResult struct {
	// Boots counts the boots the server has seen of this node since it
	// enrolled (TPM evidence).
	Boots int64 `json:"boots"`
	// IntervalSeconds is when to attest again (the agent adds jitter).
	IntervalSeconds int64 `json:"intervalSeconds"`
}

// Refusal is the body of every refusal: Reason is machine-readable (an
// attest.Reason), Detail is for humans and never holds a secret.
type Refusal struct {
	Reason attest.Reason `json:"reason"`
	Detail string        `json:"detail,omitempty"`
}

// FirstBootFiles are the files of a full config that a machine needs
// before its kubelet can join, when the full config is fetched after
// Ignition ran (the agent's two-stage mode): the files the OpenShift MCS
// appends to every config (the kubelet's bootstrap kubeconfig, the kubelet
// CA, the initial node annotations, the served MachineConfig, the
// encapsulated MachineConfig that machine-config-daemon-firstboot.service
// reads) and the pull secret. The Machine Config Daemon applies everything
// else from the cluster once the node is approved.
var FirstBootFiles = []string{
	"/etc/kubernetes/kubeconfig",
	"/etc/kubernetes/kubelet-ca.crt",
	"/etc/machine-config-daemon/node-annotations.json",
	"/etc/mcs-machine-config-content.json",
	"/etc/ignition-machine-config-encapsulated.json",
	"/var/lib/kubelet/config.json",
}

// IgnitionAccept is the Accept header the agent sends for a full config
// (what Ignition v2.24 sends).
const IgnitionAccept = "application/vnd.coreos.ignition+json;version=3.5.0, */*;q=0.1"
