// Package operate holds the operator's workflows on the store — revoke,
// unban, release, adopt, clearing a single-use marker, reading a node's
// last verified claims, and restoring the embedded store from a backup —
// each written once. The command line calls them on the store it opened
// (the kubernetes store, or the embedded store's file when no server
// runs); a running server's admin socket calls them on its own store when
// the command line reaches it there. So a workflow checks, writes and
// words its outcome the same way whoever runs it.
//
// A workflow writes to the store and returns an Outcome: what was done,
// in one message, and the Event it calls for. What it does outside the
// store (the node's bootstrap tokens deleted, the Event written) is
// Outcome.Apply with the caller's Effects: the command line has the
// cluster's credentials, the server's admin socket does not act on the
// cluster for an operator.
//
// Each workflow asks only for the store operations it uses (its own small
// interface), so the admin socket's client, which serves reads and these
// workflows, and the stores themselves all fit.
package operate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
)

// Event is the Event a workflow calls for on a node's binding.
type Event struct {
	NodeName string `json:"nodeName"`
	// UID is the binding's object uid with the kubernetes store (so the
	// Event is listed under it), else empty.
	UID string `json:"uid,omitempty"`
	// Component is the Event's source ("nodeproof-revoke", …).
	Component string    `json:"component"`
	Reason    string    `json:"reason"`
	Message   string    `json:"message"`
	Warning   bool      `json:"warning,omitempty"`
	Time      time.Time `json:"time"`
}

// Outcome is what a workflow did.
type Outcome struct {
	// Message says it in one line, for the operator.
	Message string `json:"message"`
	// Event is the Event it calls for (nil: none).
	Event *Event `json:"event,omitempty"`
	// Identity is the identity acted on; TokenRecords, after a revoke,
	// the enrolment records of that identity under its node, whose
	// bootstrap tokens are to be deleted at once.
	Identity     string   `json:"identity,omitempty"`
	TokenRecords []string `json:"tokenRecords,omitempty"`
	// Revoked: the outcome of a revoke (Apply deletes the identity's
	// bootstrap tokens, whether or not it held a name).
	Revoked bool `json:"revoked,omitempty"`
}

// Effects are what a workflow does outside the store. Nil Effects do
// nothing (the embedded store with no cluster).
type Effects interface {
	// DeleteIdentityTokens deletes the bootstrap tokens issued to
	// identity for records and returns the ones deleted.
	DeleteIdentityTokens(ctx context.Context, identity string, records []string) ([]string, error)
	// WriteEvent writes ev.
	WriteEvent(ctx context.Context, ev Event) error
}

// Apply does o's effects with e: after a revoke, the identity's bootstrap
// tokens deleted (those deleted are returned; a failure is reported, the
// ban stands); the Event written.
func (o *Outcome) Apply(ctx context.Context, e Effects) (deleted []string, err error) {
	if e == nil {
		return nil, nil
	}
	if o.Revoked {
		var derr error
		deleted, derr = e.DeleteIdentityTokens(ctx, o.Identity, o.TokenRecords)
		if derr != nil {
			err = fmt.Errorf("the ban stands, but its bootstrap tokens could not all be deleted (they expire with their records): %w", derr)
		}
	}
	if o.Event != nil {
		err = errors.Join(err, e.WriteEvent(ctx, *o.Event))
	}
	return deleted, err
}

// Revocation asks to ban a machine: the identity that holds Node, or
// Identity (exactly one of them).
type Revocation struct {
	Node     string `json:"node,omitempty"`
	Identity string `json:"identity,omitempty"`
	// NotEnrolled allows banning an Identity this store has never seen
	// (a stolen machine not yet enrolled); without it, such an identity
	// is refused as a likely misspelling.
	NotEnrolled bool      `json:"notEnrolled,omitempty"`
	Act         store.Act `json:"act"`
}

// RevokeStore is what Revoke uses.
type RevokeStore interface {
	SeenStore
	Ban(ctx context.Context, b store.Ban) (*store.Ban, error)
	Binding(ctx context.Context, nodeName string) (*store.Binding, error)
	RecordsForNode(ctx context.Context, nodeName string) ([]*store.Record, error)
}

// Revoke bans a machine. It checks, in order: exactly one of Node and
// Identity; Identity in the server's own spelling (attest.ParseIdentity:
// a ban under any other spelling would match no machine while saying
// "revoked"); an Identity this store has never seen (no binding, ban or
// released name) only with NotEnrolled; Node bound to a machine. Then it
// bans the identity (the store refuses it everything from then on, under
// any name) and names the enrolment records of that identity under its
// node, whose bootstrap tokens Apply deletes.
func Revoke(ctx context.Context, st RevokeStore, r Revocation) (*Outcome, error) {
	switch {
	case (r.Node == "") == (r.Identity == ""):
		return nil, errors.New("revoke: one of a node and an identity")
	case r.NotEnrolled && r.Identity == "":
		return nil, errors.New("revoke: not enrolled goes with an identity")
	}
	if r.Identity != "" {
		if _, err := attest.ParseIdentity(r.Identity); err != nil {
			return nil, fmt.Errorf("--identity: %w", err)
		}
		seen, err := Seen(ctx, st, r.Identity)
		if err != nil {
			return nil, err
		}
		if !seen && !r.NotEnrolled {
			return nil, fmt.Errorf("%s is not enrolled, and this server has never seen it (no binding, no ban, no released name): nothing was revoked. Check the identity (nodeproof inspect lists them), or give --not-enrolled to ban one that has not enrolled yet", r.Identity)
		}
	}
	ban, err := st.Ban(ctx, store.Ban{Identity: r.Identity, NodeName: r.Node, At: r.Act.At, By: r.Act.By, Reason: r.Act.Reason})
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("node %s is not bound to any machine (a machine that holds no name: --identity ID)", r.Node)
	} else if err != nil {
		return nil, err
	}
	where := "not enrolled: it holds no node name, and the ban stands when it tries"
	if ban.NodeName != "" {
		where = "enrolled as node " + ban.NodeName
	}
	msg := fmt.Sprintf("%s (%s evidence, %s) revoked at %s by %s: enrolment under any name, re-attestation, configs, certificates and reports are refused until nodeproof unban",
		ban.Identity, dash(string(ban.Kind)), where, ban.At.UTC().Format(time.RFC3339), ban.By)
	if ban.Reason != "" {
		msg += "; reason: " + ban.Reason
	}
	o := &Outcome{Message: msg, Identity: ban.Identity, Revoked: true}
	if ban.NodeName == "" {
		return o, nil
	}
	// The ban is written; what follows only words and aims its effects,
	// so a failed read leaves them with less to name, never undoes it.
	if recs, err := st.RecordsForNode(ctx, ban.NodeName); err == nil {
		for _, rec := range recs {
			if rec.Identity == ban.Identity {
				o.TokenRecords = append(o.TokenRecords, rec.ID)
			}
		}
	}
	o.Event = &Event{NodeName: ban.NodeName, UID: uidOf(ctx, st, ban.NodeName), Component: "nodeproof-revoke",
		Reason: "Revoked", Message: msg, Warning: true, Time: ban.At}
	return o, nil
}

// Lift asks to lift a ban: the banned identity that holds or held Node,
// or Identity (exactly one of them).
type Lift struct {
	Node     string    `json:"node,omitempty"`
	Identity string    `json:"identity,omitempty"`
	Act      store.Act `json:"act"`
}

// UnbanStore is what Unban uses.
type UnbanStore interface {
	Unban(ctx context.Context, identity string) (*store.Ban, error)
	Binding(ctx context.Context, nodeName string) (*store.Binding, error)
	Bans(ctx context.Context) ([]*store.Ban, error)
}

// Unban lifts a ban. It checks: exactly one of Node and Identity;
// Identity in the server's spelling; for Node, exactly one banned
// identity holds it or held it when banned. The identity may then
// re-attest and, if it holds no name, enrol again.
func Unban(ctx context.Context, st UnbanStore, l Lift) (*Outcome, error) {
	if (l.Node == "") == (l.Identity == "") {
		return nil, errors.New("unban: one of a node and an identity")
	}
	id := l.Identity
	if id != "" {
		if _, err := attest.ParseIdentity(id); err != nil {
			return nil, fmt.Errorf("--identity: %w", err)
		}
	} else {
		var err error
		if id, err = bannedAt(ctx, st, l.Node); err != nil {
			return nil, err
		}
	}
	ban, err := st.Unban(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%s is not banned", id)
	} else if err != nil {
		return nil, err
	}
	msg := fmt.Sprintf("ban of %s lifted by %s (it was banned at %s by %s: %s)", ban.Identity, l.Act.By,
		ban.At.UTC().Format(time.RFC3339), dash(ban.By), dash(ban.Reason))
	if l.Act.Reason != "" {
		msg += "; reason: " + l.Act.Reason
	}
	o := &Outcome{Message: msg, Identity: ban.Identity}
	if ban.NodeName != "" {
		o.Event = &Event{NodeName: ban.NodeName, UID: uidOf(ctx, st, ban.NodeName), Component: "nodeproof-unban",
			Reason: "Unbanned", Message: msg, Time: l.Act.At}
	}
	return o, nil
}

// bannedAt is the banned identity that holds node, or that held it when
// it was banned (exactly one).
func bannedAt(ctx context.Context, st UnbanStore, node string) (string, error) {
	if b, err := st.Binding(ctx, node); err == nil {
		return b.Identity, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	bans, err := st.Bans(ctx)
	if err != nil {
		return "", err
	}
	var ids []string
	for _, b := range bans {
		if b.NodeName == node {
			ids = append(ids, b.Identity)
		}
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("no banned identity holds or held node %s", node)
	case 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("%d banned identities held node %s (%v): name one with --identity", len(ids), node, ids)
}

// Naming asks to release or adopt Node.
type Naming struct {
	Node string    `json:"node"`
	Act  store.Act `json:"act"`
}

// ReleaseStore is what Release uses.
type ReleaseStore interface {
	Release(ctx context.Context, nodeName string, how ...store.Act) (*store.Binding, error)
}

// Release frees a node name from the identity that owns it: the binding
// goes to the name's history (who, when, why), a revoked identity stays
// banned. It says whose node it was. The name must be bound.
func Release(ctx context.Context, st ReleaseStore, n Naming) (*Outcome, error) {
	if n.Node == "" {
		return nil, errors.New("release: a node is required")
	}
	b, err := st.Release(ctx, n.Node, n.Act)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("node %s is not bound to any machine", n.Node)
	} else if err != nil {
		return nil, err
	}
	msg := fmt.Sprintf("node %s released by %s: it was bound to %s (%s evidence, pool %s, enrolled %s, last enrolment record %s); the next machine to enrol with this name owns it",
		n.Node, n.Act.By, b.Identity, b.Kind, b.Pool, b.CreatedAt.UTC().Format(time.RFC3339), b.RecordID)
	if b.Revoked != nil {
		msg += "; that machine stays revoked (banned) under any name: nodeproof unban --identity " + b.Identity + " lifts it"
	}
	if n.Act.Reason != "" {
		msg += "; reason: " + n.Act.Reason
	}
	return &Outcome{Message: msg, Identity: b.Identity, Event: &Event{NodeName: n.Node, UID: b.UID,
		Component: "nodeproof-release", Reason: "Released", Message: msg, Time: n.Act.At}}, nil
}

// AdoptStore is what Adopt uses.
type AdoptStore interface {
	Adopt(ctx context.Context, nodeName string, how store.Act) (*store.NameHistory, error)
	Binding(ctx context.Context, nodeName string) (*store.Binding, error)
}

// Adopt lets a pool with requested node names bind the name of a Node
// that existed before nodeproof, recording who, when and why in the
// name's history.
func Adopt(ctx context.Context, st AdoptStore, n Naming) (*Outcome, error) {
	if n.Node == "" {
		return nil, errors.New("adopt: a node is required")
	}
	h, err := st.Adopt(ctx, n.Node, n.Act)
	if err != nil {
		return nil, err
	}
	msg := fmt.Sprintf("node %s adopted by %s at %s: a machine may enrol with this name in a pool that takes requested names", n.Node, h.Adopted.By, h.Adopted.At.UTC().Format(time.RFC3339))
	return &Outcome{Message: msg, Event: &Event{NodeName: n.Node, UID: uidOf(ctx, st, n.Node),
		Component: "nodeproof-adopt", Reason: "Adopted", Message: msg, Time: n.Act.At}}, nil
}

// MarkerStore is what ClearMarker uses.
type MarkerStore interface {
	ReleaseOnce(ctx context.Context, key string) error
}

// ClearMarker clears a single-use marker that an earlier version set
// (a key with a slash: aws-instance/<account>/<instance id>).
func ClearMarker(ctx context.Context, st MarkerStore, key string) (*Outcome, error) {
	if key == "" {
		return nil, errors.New("clear: a marker's key is required")
	}
	if err := st.ReleaseOnce(ctx, key); err != nil {
		return nil, err
	}
	return &Outcome{Message: "cleared " + key}, nil
}

// SeenStore is what Seen uses.
type SeenStore interface {
	BindingOf(ctx context.Context, identity string) (*store.Binding, error)
	BanOf(ctx context.Context, identity string) (*store.Ban, error)
	Histories(ctx context.Context) ([]*store.NameHistory, error)
}

// Seen says whether this store knows identity: enrolled, banned, or
// released from a name.
func Seen(ctx context.Context, st SeenStore, identity string) (bool, error) {
	if _, err := st.BindingOf(ctx, identity); !errors.Is(err, store.ErrNotFound) {
		return err == nil, err
	}
	if _, err := st.BanOf(ctx, identity); !errors.Is(err, store.ErrNotFound) {
		return err == nil, err
	}
	hs, err := st.Histories(ctx)
	if err != nil {
		return false, err
	}
	for _, h := range hs {
		for _, r := range h.Released {
			if r.Identity == identity {
				return true, nil
			}
		}
	}
	return false, nil
}

// NodeClaims are a node's last verified claims, as its binding records
// them, with the binding.
type NodeClaims struct {
	Binding *store.Binding
	Claims  attest.Claims
}

// ClaimsStore is what ClaimsOf uses.
type ClaimsStore interface {
	Binding(ctx context.Context, nodeName string) (*store.Binding, error)
}

// ClaimsOf reads node's last verified claims (recorded at its
// re-attestations). It refuses a node with none recorded or whose record
// does not decode.
func ClaimsOf(ctx context.Context, st ClaimsStore, node string) (*NodeClaims, error) {
	b, err := st.Binding(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	if len(b.Status.Claims) == 0 {
		return nil, fmt.Errorf("node %s: %w", node, ErrNoClaims)
	}
	nc := &NodeClaims{Binding: b}
	if err := json.Unmarshal(b.Status.Claims, &nc.Claims); err != nil {
		return nil, fmt.Errorf("node %s: its recorded claims do not decode: %w", node, err)
	}
	return nc, nil
}

// ErrNoClaims: the node has no recorded claims yet (enrolled, not
// re-attested since).
var ErrNoClaims = errors.New("no claims recorded yet (they are recorded at re-attestation)")

// uidOf is node's binding's object uid, when the store has one (the
// kubernetes store), else "".
func uidOf(ctx context.Context, st interface {
	Binding(ctx context.Context, nodeName string) (*store.Binding, error)
}, node string) string {
	if b, err := st.Binding(ctx, node); err == nil {
		return b.UID
	}
	return ""
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Operations are the workflows, wherever they run: On runs them on a
// store in this process; the admin socket's client (adminsock.Client)
// runs them in the server that holds the store.
type Operations interface {
	Revoke(ctx context.Context, r Revocation) (*Outcome, error)
	Unban(ctx context.Context, l Lift) (*Outcome, error)
	Release(ctx context.Context, n Naming) (*Outcome, error)
	Adopt(ctx context.Context, n Naming) (*Outcome, error)
	ClearMarker(ctx context.Context, key string) (*Outcome, error)
}

// Store is what the workflows use, together.
type Store interface {
	RevokeStore
	UnbanStore
	ReleaseStore
	AdoptStore
	MarkerStore
}

// On runs the workflows on Store, in this process.
type On struct{ Store Store }

// Revoke runs Revoke on o.Store.
func (o On) Revoke(ctx context.Context, r Revocation) (*Outcome, error) {
	return Revoke(ctx, o.Store, r)
}

// Unban runs Unban on o.Store.
func (o On) Unban(ctx context.Context, l Lift) (*Outcome, error) { return Unban(ctx, o.Store, l) }

// Release runs Release on o.Store.
func (o On) Release(ctx context.Context, n Naming) (*Outcome, error) { return Release(ctx, o.Store, n) }

// Adopt runs Adopt on o.Store.
func (o On) Adopt(ctx context.Context, n Naming) (*Outcome, error) { return Adopt(ctx, o.Store, n) }

// ClearMarker runs ClearMarker on o.Store.
func (o On) ClearMarker(ctx context.Context, key string) (*Outcome, error) {
	return ClearMarker(ctx, o.Store, key)
}
