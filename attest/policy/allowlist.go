package policy

import (
	"fmt"
	"slices"

	"github.com/nodeproof/nodeproof/attest"
)

// AllowList is one of a pool's allow-lists with its explicit any, as the
// YAML writes them side by side (gcp.projects and gcp.anyProject): what
// Items lists is allowed, or everything is with Any. An empty list
// without Any allows nothing — it never means any — and a policy with one
// does not load (check); both at once is a mistake too.
type AllowList struct {
	// Field and AnyField name the list and its any in the pool
	// ("gcp.projects", "gcp.anyProject"): the list is checked in a pool
	// that takes a kind it judges (its block's: the table of kinds); What is what it lists, for
	// messages ("projects whose instances may attest").
	Field, AnyField, What string
	Items                 []string
	Any                   bool
	// Open, when Any is set, is the warning the server logs at start
	// (Policy.Warnings); Wide marks the lists whose any opens the pool to
	// the world (any GCP project, any AWS account), warned apart.
	Open string
	Wide bool
}

// Allows reports whether v is allowed: Any, or v listed.
func (l AllowList) Allows(v string) bool { return l.Any || slices.Contains(l.Items, v) }

// check refuses an empty list without its any (it would allow nothing and
// read as "any") and a list beside its any.
func (l AllowList) check() error {
	switch {
	case len(l.Items) == 0 && !l.Any:
		return fmt.Errorf("%s is empty: list the %s (an empty list does not mean any; set %s: true for that)", l.Field, l.What, l.AnyField)
	case len(l.Items) > 0 && l.Any:
		return fmt.Errorf("%s and %s: choose one", l.Field, l.AnyField)
	}
	return nil
}

// AllowLists are the pool's allow-lists, for every kind of evidence
// (whether or not the pool takes it), in the order they are checked.
func (pp Pool) AllowLists() []AllowList {
	t := pp.TPM
	if t.UKI != nil {
		// A UKI pool: the UKI, and the shim only when one runs it.
		out := []AllowList{t.EKTrustList(), t.UKI.ukiList()}
		if !emptyStage(t.BootComponents.Shim) {
			out = append(out, t.BootComponents.Shim.allowList("shim", "shim"))
		}
		for _, c := range clouds {
			out = append(out, c.lists(&pp)...)
		}
		return out
	}
	out := []AllowList{t.EKTrustList(), t.BootComponents.Shim.allowList("shim", "shim"),
		t.BootComponents.Bootloader.allowList("bootloader", "boot loader"), t.BootComponents.Kernel.allowList("kernel", "kernel"),
		t.kernelCmdlineList(), t.grubList()}
	for _, c := range clouds {
		out = append(out, c.lists(&pp)...)
	}
	return out
}

// takes reports whether the pool takes evidence of kind k.
func (pp Pool) takes(k attest.Kind) bool { return slices.Contains(pp.Evidence, k) }
