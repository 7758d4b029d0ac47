package inspect_test

import (
	"bytes"
	"context"
	"crypto"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/attest/uefivar/microsoft"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/store"
)

// bindingOf is a binding of node whose recorded claims are a TPM's that
// booted log ("" none recorded).
func bindingOf(t *testing.T, node, log string) *store.Binding {
	t.Helper()
	b := &store.Binding{NodeName: node, Pool: "worker", Kind: attest.KindTPM, Identity: "tpm-ek:" + node}
	if log == "" {
		return b
	}
	bs, err := tpm.LogBootState(firmwaretestdata.MustLog(log), crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	c, err := json.Marshal(&attest.Claims{Kind: attest.KindTPM, Identity: b.Identity, TPM: &attest.TPMClaims{Boot: bs}})
	if err != nil {
		t.Fatal(err)
	}
	b.Status.Claims, b.Status.LastAttempt = c, time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	return b
}

// bindingsOnly is a store that holds bindings (the view reads no more).
type bindingsOnly struct {
	inspect.Store
	bs []*store.Binding
}

func (s bindingsOnly) Bindings(context.Context) ([]*store.Binding, error) { return s.bs, nil }

// TestSecureBootCAView: each node's standing from its recorded claims,
// and the count of nodes in each, most first; a node with no claims
// recorded yet counts as unknown, never as moved.
func TestSecureBootCAView(t *testing.T) {
	bs := []*store.Binding{
		bindingOf(t, "w-1", "rhel8-uefi"), bindingOf(t, "w-2", "debian-12-ovmf-secure-boot"),
		bindingOf(t, "w-3", "ubuntu-2404-intel-tdx"), bindingOf(t, "w-4", ""),
	}
	v, err := inspect.ListSecureBootCAs(context.Background(), inspect.Sources{Store: bindingsOnly{bs: bs}, Clock: time.Now}, microsoft.Set{})
	if err != nil {
		t.Fatal(err)
	}
	want := []inspect.SecureBootCACount{
		{Transition: microsoft.Transition{DB: "2011", KEK: "2011", Chain: "2011"}, Nodes: 2},
		{Transition: microsoft.Transition{DB: "2011+2023", KEK: "2011+2023", Chain: "unknown"}, Nodes: 1},
		{Transition: microsoft.Transition{DB: "unknown", KEK: "unknown", Chain: "unknown"}, Nodes: 1},
	}
	if len(v.Counts) != len(want) {
		t.Fatalf("counts %+v, want %+v", v.Counts, want)
	}
	for i := range want {
		if v.Counts[i] != want[i] {
			t.Errorf("count %d: %+v, want %+v", i, v.Counts[i], want[i])
		}
	}
	if n := v.Nodes[3]; n.Name != "w-4" || n.DB != microsoft.Unknown || n.Recorded != "" {
		t.Errorf("the node with no claims: %+v", n)
	}
	var out bytes.Buffer
	if err := inspect.WriteSecureBootCAs(&out, inspect.FormatTable, v); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"NODES", "2011+2023", "w-3", "w-4"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the table does not show %q:\n%s", s, out.String())
		}
	}
}
