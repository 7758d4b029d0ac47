package policy

import (
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
)

// TestAllowLists: every allow-list of a pool, through AllowList: an empty
// list without its any refuses to load, naming both fields; a list beside
// its any refuses; a listed value is allowed and another is not; with the
// any, everything is allowed and the server warns, naming the any.
func TestAllowLists(t *testing.T) {
	all := Pool{Evidence: []attest.Kind{attest.KindTPM, attest.KindGCP, attest.KindAWS, attest.KindAzureVTPM}}
	for i := range all.AllowLists() {
		field := all.AllowLists()[i].Field
		t.Run(field, func(t *testing.T) {
			// set gives the i-th list of a pool items and an any.
			set := func(items []string, anyOn bool) Pool {
				pp := Pool{Evidence: all.Evidence}
				pp.TPM.KernelCmdline, pp.TPM.Grub = &KernelCmdline{}, &GrubRules{}
				lists := []*[]string{&pp.TPM.EKTrust, &pp.TPM.BootComponents.Shim.Allow, &pp.TPM.BootComponents.Bootloader.Allow,
					&pp.TPM.BootComponents.Kernel.Allow, &pp.TPM.KernelCmdline.Exact, &pp.TPM.Grub.Commands,
					&pp.GCP.Projects, &pp.GCP.Zones, &pp.AWS.Accounts, &pp.AWS.Regions, &pp.Azure.Subscriptions}
				anys := []*bool{&pp.TPM.AnyEKTrust, &pp.TPM.BootComponents.Shim.Any, &pp.TPM.BootComponents.Bootloader.Any,
					&pp.TPM.BootComponents.Kernel.Any, &pp.TPM.KernelCmdline.Any, &pp.TPM.Grub.Any,
					&pp.GCP.AnyProject, &pp.GCP.AnyZone, &pp.AWS.AnyAccount, &pp.AWS.AnyRegion, &pp.Azure.AnySubscription}
				for j := range lists {
					*anys[j] = true // the others open, so only the i-th is judged
				}
				*lists[i], *anys[i] = items, anyOn
				return pp
			}
			l := set(nil, false).AllowLists()[i]
			if l.Field != field || l.AnyField == "" || l.What == "" || l.Open == "" {
				t.Fatalf("list %d is %+v, want %s with its any, what it lists and its warning", i, l, field)
			}
			if err := l.check(); err == nil || !strings.Contains(err.Error(), l.Field) || !strings.Contains(err.Error(), l.AnyField) {
				t.Errorf("empty without any: %v; want a refusal naming %s and %s", err, l.Field, l.AnyField)
			}
			if l.Allows("x") {
				t.Errorf("an empty list allows x")
			}
			if err := set([]string{"x"}, true).AllowLists()[i].check(); err == nil {
				t.Errorf("a list beside its any loads")
			}
			listed := set([]string{"x"}, false).AllowLists()[i]
			if listed.check() != nil || !listed.Allows("x") || listed.Allows("y") {
				t.Errorf("listed x: check %v, allows x %v, y %v; want ok, true, false", listed.check(), listed.Allows("x"), listed.Allows("y"))
			}
			open := set(nil, true).AllowLists()[i]
			if open.check() != nil || !open.Allows("y") {
				t.Errorf("any: check %v, allows y %v", open.check(), open.Allows("y"))
			}
			pol := &Policy{Pools: map[string]Pool{"p": set(nil, true)}}
			warned := false
			for _, w := range pol.Warnings() {
				warned = warned || strings.Contains(w, open.AnyField)
			}
			if !warned {
				t.Errorf("%s: true is not among the warnings %q", open.AnyField, pol.Warnings())
			}
		})
	}
}
