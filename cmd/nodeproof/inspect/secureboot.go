package inspect

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/nodeproof/nodeproof/attest/uefivar/microsoft"
	"github.com/nodeproof/nodeproof/store"
)

// SecureBootCAs is the fleet's move off Microsoft's 2011 Secure Boot CAs
// (`nodeproof inspect secureboot-ca`): each node's standing, read from its
// last recorded claims (microsoft.TransitionOf), and the count of nodes
// in each standing.
type SecureBootCAs struct {
	Nodes []SecureBootCANode `json:"nodes"`
	// Counts are the nodes in each standing, most first.
	Counts []SecureBootCACount `json:"counts"`
}

// SecureBootCANode is one node's standing.
type SecureBootCANode struct {
	Name string `json:"name"`
	Pool string `json:"pool"`
	microsoft.Transition
	// Recorded is when its claims were (its last attestation); zero when
	// none are recorded (enrolled, not re-attested since): its standing
	// is unknown.
	Recorded string `json:"recorded,omitempty"`
}

// SecureBootCACount is how many nodes stand where.
type SecureBootCACount struct {
	microsoft.Transition
	Nodes int `json:"nodes"`
}

// CountCAStandings counts bs's nodes by standing (judged by cas), most
// first (then by standing, for a stable order).
func CountCAStandings(cas microsoft.Set, bs []*store.Binding) []SecureBootCACount {
	n := map[microsoft.Transition]int{}
	for _, b := range bs {
		n[cas.TransitionOfRecorded(b.Status.Claims)]++
	}
	out := make([]SecureBootCACount, 0, len(n))
	for t, c := range n {
		out = append(out, SecureBootCACount{Transition: t, Nodes: c})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Nodes != out[j].Nodes {
			return out[i].Nodes > out[j].Nodes
		}
		a, b := out[i].Transition, out[j].Transition
		return a.DB+a.KEK+a.Chain < b.DB+b.KEK+b.Chain
	})
	return out
}

// ListSecureBootCAs reads every bound node's standing, judged by cas
// (the policy's: Microsoft's CAs and its trust.secureBootCAs).
func ListSecureBootCAs(ctx context.Context, s Sources, cas microsoft.Set) (*SecureBootCAs, error) {
	bs, err := s.Store.Bindings(ctx)
	if err != nil {
		return nil, fmt.Errorf("inspect: bindings: %w", err)
	}
	v := &SecureBootCAs{Nodes: make([]SecureBootCANode, 0, len(bs)), Counts: CountCAStandings(cas, bs)}
	for _, b := range bs {
		n := SecureBootCANode{Name: b.NodeName, Pool: b.Pool, Transition: cas.TransitionOfRecorded(b.Status.Claims)}
		if len(b.Status.Claims) > 0 {
			n.Recorded = stamp(b.Status.LastAttempt)
		}
		v.Nodes = append(v.Nodes, n)
	}
	sort.Slice(v.Nodes, func(i, j int) bool { return v.Nodes[i].Name < v.Nodes[j].Name })
	return v, nil
}

// WriteSecureBootCAs writes the view: the counts, then each node.
func WriteSecureBootCAs(w io.Writer, format string, v *SecureBootCAs) error {
	if format != FormatTable {
		return write(w, format, v)
	}
	fmt.Fprintf(w, "Microsoft Secure Boot CAs, 2011 → 2023 (db and KEK as measured; CHAIN: the CA that verified the shim; unknown: no claims recorded yet, or not measured):\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODES\tDB\tKEK\tCHAIN")
	for _, c := range v.Counts {
		cells(tw, "  ", fmt.Sprint(c.Nodes), c.DB, c.KEK, c.Chain)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPOOL\tDB\tKEK\tCHAIN\tRECORDED")
	for _, n := range v.Nodes {
		cells(tw, "", n.Name, n.Pool, n.DB, n.KEK, n.Chain, dash(n.Recorded))
	}
	return tw.Flush()
}
