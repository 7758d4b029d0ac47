// Package inspect gathers what an operator needs to see why a machine is,
// or is not, a trusted node: from the store, each node name's binding
// (owning identity, enrolment, revocation, latest attestation and its boot
// claims) and records; from the cluster, when there is one, the Node's
// Attested condition and taints, the node's kubelet CSRs with their
// decisions, and the Events written about all of these. It only reads.
//
// `nodeproof inspect` lists nodes (List); `nodeproof inspect NODE` tells
// one node's story (StoryOf). Output is a table (WriteList, WriteStory) or
// the same structures as JSON or YAML.
package inspect

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
)

// States of a node (Node.State).
const (
	// StateAttested: enrolled, not revoked, latest attestation passed
	// and is fresh.
	StateAttested = "Attested"
	// StateFailed: its latest attestation failed.
	StateFailed = "Failed"
	// StateStale: no passing attestation within the pool's window.
	StateStale = "Stale"
	// StateRevoked: an operator revoked the identity.
	StateRevoked = "Revoked"
	// StateUnbound: records exist for the name, but no identity owns it
	// (released, or never enrolled).
	StateUnbound = "Unbound"
	// StateReleased: no identity owns the name, and the name's history
	// says an operator released it (or adopted it): its Node stays
	// nodeproof's, tainted until a machine enrols with the name.
	StateReleased = "Released"
)

// Store is what inspect reads of the store: records, bindings, bans and
// names' histories.
type Store interface {
	store.RecordReader
	store.BindingReader
	store.BanReader
	store.NameReader
}

// Sources are where inspect reads.
type Sources struct {
	// Store is the server's store (embedded or Kubernetes), or a running
	// server's admin socket.
	Store Store
	// Kube, when set, is the cluster: Nodes, CSRs and Events are read
	// from it. With the embedded store and no cluster it is nil.
	Kube kubernetes.Interface
	// Fresh gives a pool's freshness window (how long an attestation
	// counts), as the policy's lifetime says.
	Fresh func(pool string) time.Duration
	// Clock is now.
	Clock func() time.Time
	// MaxItems bounds how many CSRs and Events are read (0: 5,000), so a
	// cluster with a huge history cannot make inspect run out of memory.
	MaxItems int
}

// Node is one node name's line: who owns it and whether it is attested.
type Node struct {
	Name     string `json:"name"`
	Pool     string `json:"pool"`
	Kind     string `json:"kind"`
	Identity string `json:"identity"`
	// Enrolled is when the identity first enrolled under the name.
	Enrolled time.Time `json:"enrolled"`
	// LastAttested is when it last passed (enrolment or re-attestation).
	LastAttested time.Time `json:"lastAttested"`
	// LastAttempt is when it last attested, passed or not (zero: only the
	// enrolment).
	LastAttempt time.Time `json:"lastAttempt,omitzero"`
	// State is one of the State constants; Reason and Message say why
	// it is not Attested.
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Boots seen since enrolment.
	Boots int64 `json:"boots"`
}

// Story is one node's whole story.
type Story struct {
	Node
	// Binding is the store's binding (nil when Unbound).
	Binding *store.Binding `json:"binding,omitempty"`
	// Evidence is the latest attestation's evidence in one line; Claims
	// its claims (the enrolment's, until the node re-attests).
	Evidence string          `json:"evidence,omitempty"`
	Claims   json.RawMessage `json:"claims,omitempty"`
	// Records are the enrolment records, newest first.
	Records []*store.Record `json:"records"`
	// Bans are the bans of the identity that holds the name and of every
	// identity banned while holding it.
	Bans []*store.Ban `json:"bans,omitempty"`
	// History is the name's history: releases and adoption (nil: none).
	History *store.NameHistory `json:"history,omitempty"`
	// Cluster is what the cluster says (nil without one).
	Cluster *Cluster `json:"cluster,omitempty"`
}

// Overview is everything `nodeproof inspect` lists: the bound nodes, the
// banned identities, and the names released (or adopted) that no identity
// holds now.
type Overview struct {
	Nodes    []Node               `json:"nodes"`
	Bans     []*store.Ban         `json:"bans"`
	Released []*store.NameHistory `json:"released"`
}

// ListAll returns the overview: List, every ban (by identity) and every
// name with a history and no binding, by name.
func ListAll(ctx context.Context, s Sources) (*Overview, error) {
	nodes, err := List(ctx, s)
	if err != nil {
		return nil, err
	}
	o := &Overview{Nodes: nodes, Bans: []*store.Ban{}, Released: []*store.NameHistory{}}
	bans, err := s.Store.Bans(ctx)
	if err != nil {
		return nil, fmt.Errorf("inspect: bans: %w", err)
	}
	o.Bans = append(o.Bans, bans...)
	sort.Slice(o.Bans, func(i, j int) bool { return o.Bans[i].Identity < o.Bans[j].Identity })
	hs, err := s.Store.Histories(ctx)
	if err != nil {
		return nil, fmt.Errorf("inspect: name histories: %w", err)
	}
	bound := map[string]bool{}
	for _, n := range nodes {
		bound[n.Name] = true
	}
	for _, h := range hs {
		if !bound[h.NodeName] {
			o.Released = append(o.Released, h)
		}
	}
	sort.Slice(o.Released, func(i, j int) bool { return o.Released[i].NodeName < o.Released[j].NodeName })
	return o, nil
}

// Cluster is a node as the cluster sees it.
type Cluster struct {
	// Registered is false when no Node object exists (yet).
	Registered bool `json:"registered"`
	// Condition is the Node's Attested condition (nil when unset).
	Condition *corev1.NodeCondition `json:"condition,omitempty"`
	// Taints are nodeproof's taints on the Node.
	Taints []corev1.Taint `json:"taints,omitempty"`
	// CSRs are the kubelet CSRs for the node, oldest first.
	CSRs []CSR `json:"csrs"`
	// Events are the Events about the node's binding, its Node and its
	// CSRs, oldest first.
	Events []Event `json:"events"`
}

// CSR is a kubelet CSR for the node and its decision.
type CSR struct {
	Name      string    `json:"name"`
	Created   time.Time `json:"created"`
	Signer    string    `json:"signer"`
	Requester string    `json:"requester"`
	// Decision is Approved, Denied, Failed or Pending; Reason and
	// Message are the decision's.
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
}

// Event is one Kubernetes Event.
type Event struct {
	Time    time.Time `json:"time"`
	Object  string    `json:"object"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Count   int32     `json:"count,omitempty"`
}

// ErrUnknownNode: the store knows nothing of the name.
var ErrUnknownNode = errors.New("no binding and no record for this node name")

// List returns every bound node, by name.
func List(ctx context.Context, s Sources) ([]Node, error) {
	bs, err := s.Store.Bindings(ctx)
	if err != nil {
		return nil, fmt.Errorf("inspect: bindings: %w", err)
	}
	now := s.Clock()
	out := make([]Node, 0, len(bs))
	for _, b := range bs {
		out = append(out, s.line(b, now))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// line is a binding's Node.
func (s Sources) line(b *store.Binding, now time.Time) Node {
	n := Node{Name: b.NodeName, Pool: b.Pool, Kind: string(b.Kind), Identity: b.Identity,
		Enrolled: b.CreatedAt, LastAttempt: b.Status.LastAttempt, Boots: b.Status.Boots}
	ok, reason, last := b.Attested(now, s.Fresh(b.Pool))
	n.LastAttested = b.EnrolledAt
	if b.Status.LastSuccess.After(n.LastAttested) {
		n.LastAttested = b.Status.LastSuccess
	}
	switch {
	case ok:
		n.State = StateAttested
	case reason == attest.ReasonRevoked:
		n.State, n.Reason, n.Message = StateRevoked, string(reason), b.Revoked.Reason
	case reason == attest.ReasonAttestationFailed:
		n.State, n.Reason, n.Message = StateFailed, b.Status.Reason, b.Status.Message
	default:
		n.State, n.Reason = StateStale, string(reason)
		n.Message = fmt.Sprintf("no passing attestation since %s (window %s)", last.UTC().Format(time.RFC3339), s.Fresh(b.Pool))
	}
	return n
}

// StoryOf gathers node's story. A name the store does not know gives
// ErrUnknownNode; a cluster that cannot be read is an error (the story
// would be told half).
func StoryOf(ctx context.Context, s Sources, node string) (*Story, error) {
	recs, err := s.Store.RecordsForNode(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("inspect: records of %s: %w", node, err)
	}
	hist, err := s.Store.History(ctx, node)
	if errors.Is(err, store.ErrNotFound) {
		hist = nil
	} else if err != nil {
		return nil, fmt.Errorf("inspect: history of %s: %w", node, err)
	}
	b, err := s.Store.Binding(ctx, node)
	switch {
	case errors.Is(err, store.ErrNotFound):
		b = nil
		if len(recs) == 0 && hist == nil {
			return s.neverEnrolled(ctx, node)
		}
	case err != nil:
		return nil, fmt.Errorf("inspect: binding of %s: %w", node, err)
	}
	st := &Story{Records: recs, History: hist}
	if st.Bans, err = s.bansAt(ctx, node, b); err != nil {
		return nil, err
	}
	if b != nil {
		st.Node = s.line(b, s.Clock())
		st.Evidence, st.Claims = b.Status.Summary, json.RawMessage(b.Status.Claims)
		shown := *b
		shown.Status.Claims = nil // shown once, as Claims
		st.Binding = &shown
	} else if hist != nil {
		st.Node = Node{Name: node, State: StateReleased,
			Message: "no identity owns the name; it was nodeproof's (released or adopted, see its history): its Node stays tainted until a machine enrols with it"}
		if len(hist.Released) > 0 {
			r := hist.Released[0]
			st.Pool, st.Kind, st.Identity = r.Pool, string(r.Kind), r.Identity
		}
	} else {
		r := recs[0]
		st.Node = Node{Name: node, Pool: r.Pool, Kind: string(r.Kind), Identity: r.Identity, State: StateUnbound,
			Message: "no identity owns the name (released, or never enrolled)"}
	}
	if st.Evidence == "" {
		for _, r := range recs {
			if b == nil || r.ID == b.RecordID {
				st.Evidence = r.Summary
				break
			}
		}
	}
	if len(st.Claims) == 0 {
		st.Claims = nil
	}
	if s.Kube != nil {
		if st.Cluster, err = s.cluster(ctx, node); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// bansAt are the bans of b's identity (when bound) and of identities
// banned while holding node.
func (s Sources) bansAt(ctx context.Context, node string, b *store.Binding) ([]*store.Ban, error) {
	bans, err := s.Store.Bans(ctx)
	if err != nil {
		return nil, fmt.Errorf("inspect: bans: %w", err)
	}
	var out []*store.Ban
	for _, ban := range bans {
		if ban.NodeName == node || (b != nil && ban.Identity == b.Identity) {
			out = append(out, ban)
		}
	}
	return out, nil
}

// neverEnrolled is the story of a name no machine enrolled under: what
// the cluster knows of it (a failure report's Event, a refused CSR), or
// ErrUnknownNode when nothing.
func (s Sources) neverEnrolled(ctx context.Context, node string) (*Story, error) {
	if s.Kube == nil {
		return nil, fmt.Errorf("inspect %s: %w", node, ErrUnknownNode)
	}
	c, err := s.cluster(ctx, node)
	if err != nil {
		return nil, err
	}
	if !c.Registered && len(c.CSRs) == 0 && len(c.Events) == 0 {
		return nil, fmt.Errorf("inspect %s: %w", node, ErrUnknownNode)
	}
	return &Story{Node: Node{Name: node, State: StateUnbound,
		Message: "no machine enrolled under this name; the cluster's Events below say what was tried"}, Records: []*store.Record{}, Cluster: c}, nil
}

// cluster reads the Node, the node's CSRs and the Events about them.
func (s Sources) cluster(ctx context.Context, node string) (*Cluster, error) {
	c := &Cluster{CSRs: []CSR{}, Events: []Event{}}
	n, err := s.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("inspect: node %s: %w", node, err)
	default:
		c.Registered = true
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == approver.ConditionAttested {
				c.Condition = &n.Status.Conditions[i]
			}
		}
		for _, t := range n.Spec.Taints {
			if strings.HasPrefix(t.Key, "nodeproof.io/") {
				c.Taints = append(c.Taints, t)
			}
		}
	}
	if c.CSRs, err = s.csrs(ctx, node); err != nil {
		return nil, err
	}
	objects := []string{node}
	for _, r := range c.CSRs {
		objects = append(objects, r.Name)
	}
	for _, name := range objects {
		evs, err := s.events(ctx, name)
		if err != nil {
			return nil, err
		}
		c.Events = append(c.Events, evs...)
	}
	sort.SliceStable(c.Events, func(i, j int) bool { return c.Events[i].Time.Before(c.Events[j].Time) })
	return c, nil
}

func (s Sources) max() int64 {
	if s.MaxItems > 0 {
		return int64(s.MaxItems)
	}
	return 5000
}

// csrs returns the CSRs whose subject or requester is system:node:node,
// oldest first.
func (s Sources) csrs(ctx context.Context, node string) ([]CSR, error) {
	user := "system:node:" + node
	out := []CSR{}
	opts := metav1.ListOptions{Limit: 500}
	for read := int64(0); read < s.max(); {
		l, err := s.Kube.CertificatesV1().CertificateSigningRequests().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("inspect: CSRs: %w", err)
		}
		read += int64(len(l.Items))
		for i := range l.Items {
			r := &l.Items[i]
			if r.Spec.Username != user && subjectCN(r.Spec.Request) != user {
				continue
			}
			out = append(out, csrOf(r))
		}
		if opts.Continue = l.Continue; opts.Continue == "" {
			break
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// subjectCN is the common name a PEM CSR asks for ("" if unreadable).
func subjectCN(request []byte) string {
	blk, _ := pem.Decode(request)
	if blk == nil {
		return ""
	}
	r, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return ""
	}
	return r.Subject.CommonName
}

func csrOf(r *certv1.CertificateSigningRequest) CSR {
	c := CSR{Name: r.Name, Created: r.CreationTimestamp.Time, Signer: r.Spec.SignerName, Requester: r.Spec.Username, Decision: "Pending"}
	for _, cond := range r.Status.Conditions {
		switch cond.Type {
		case certv1.CertificateApproved, certv1.CertificateDenied, certv1.CertificateFailed:
			c.Decision, c.Reason, c.Message = string(cond.Type), cond.Reason, cond.Message
		}
	}
	return c
}

// events returns the Events, in every namespace, about objects named
// name (the NodeBinding and Node share the node's name; a CSR its own).
func (s Sources) events(ctx context.Context, name string) ([]Event, error) {
	sel := fields.OneTermEqualSelector("involvedObject.name", name).String()
	l, err := s.Kube.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel, Limit: s.max()})
	if err != nil {
		return nil, fmt.Errorf("inspect: events about %s: %w", name, err)
	}
	out := make([]Event, 0, len(l.Items))
	for i := range l.Items {
		e := &l.Items[i]
		switch e.InvolvedObject.Kind {
		case "NodeBinding", "Node", "CertificateSigningRequest":
		default:
			continue
		}
		t := e.LastTimestamp.Time
		if t.IsZero() {
			t = e.EventTime.Time
		}
		if t.IsZero() {
			t = e.CreationTimestamp.Time
		}
		out = append(out, Event{Time: t, Object: e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name,
			Type: e.Type, Reason: e.Reason, Message: e.Message, Count: e.Count})
	}
	return out, nil
}
