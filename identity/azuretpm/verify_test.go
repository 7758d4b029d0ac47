package azuretpm_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/identity/azuretpm/azuretpmtest"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// bootLog is the event log of a real UEFI VM boot (a GCE Shielded VM's,
// Ubuntu 21.04: the firmware-testdata set has no Azure log); the whole-
// boot rules read it as any other.
const bootLog = "ubuntu-2104-no-secure-boot"

// world is what the tests share: lab stand-ins for Azure's vTPM CA and
// IMDS's signer, a fake IMDS, and a swtpm VM provisioned as Azure
// provisions a Trusted Launch vTPM.
type world struct {
	now  time.Time
	ca   *azuretpmtest.CA
	imca *azuretpmtest.IMDSCA
	imds *azuretpmtest.IMDS
	man  *swtpm.Manufacturer
	vm   *azuretpmtest.VM
}

var (
	worldOnce sync.Once
	theWorld  *world
	worldErr  error
)

func newWorld(t testing.TB) *world {
	t.Helper()
	worldOnce.Do(func() {
		w := &world{now: time.Now().Truncate(time.Second)}
		if w.ca, worldErr = azuretpmtest.NewCA(w.now); worldErr != nil {
			return
		}
		if w.imca, worldErr = azuretpmtest.NewIMDSCA(w.now, "metadata.azure.com"); worldErr != nil {
			return
		}
		w.imds = azuretpmtest.NewIMDS(w.imca, func() time.Time { return w.now })
		dir, err := os.MkdirTemp("", "nodeproof-azuretpm-")
		if err != nil {
			worldErr = err
			return
		}
		if w.man, worldErr = swtpm.NewManufacturer(dir); worldErr != nil {
			return
		}
		w.vm, worldErr = w.ca.NewVM(context.Background(), w.man, dir+"/vm", firmwaretestdata.MustLog(bootLog), azuretpmtest.VMID, w.now, azuretpmtest.VMOptions{})
		theWorld = w
	})
	if worldErr != nil {
		t.Fatalf("Azure vTPM test world (needs swtpm: %s): %v", swtpm.InstallHint, worldErr)
	}
	return theWorld
}

// newVM provisions another VM (its own swtpm) for vmID.
func (w *world) newVM(t testing.TB, vmID string, o azuretpmtest.VMOptions) *azuretpmtest.VM {
	t.Helper()
	vm, err := w.ca.NewVM(context.Background(), w.man, t.TempDir(), firmwaretestdata.MustLog(bootLog), vmID, w.now, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.Close)
	return vm
}

func (w *world) verifier(t testing.TB, o azuretpm.Options) *azuretpm.Verifier {
	t.Helper()
	if o.Trust == nil {
		tr, err := azuretpmtest.Trust(w.ca, w.imca, w.now)
		if err != nil {
			t.Fatal(err)
		}
		o.Trust = tr
	}
	if o.Clock == nil {
		o.Clock = func() time.Time { return w.now }
	}
	v, err := azuretpm.NewVerifier(o)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// attestation runs the node's side against v on vm, with the fake IMDS:
// challenge, collector, answer.
func (w *world) attestation(t testing.TB, v *azuretpm.Verifier, vm *azuretpmtest.VM) (*attest.Session, *azuretpm.Evidence) {
	t.Helper()
	ch, err := vm.Dial()
	if err != nil {
		t.Fatal(err)
	}
	c, err := azuretpm.NewCollector(context.Background(), ch, azuretpm.CollectorOptions{IMDS: w.imds.Client()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := testenv.KubeletKeySHA256(t)
	chal, sess, err := v.Challenge("workers", key, c.Request())
	if err != nil {
		t.Fatal(err)
	}
	ev, err := c.Answer(chal, key)
	if err != nil {
		t.Fatal(err)
	}
	return sess, ev
}

// TestVerify: an Azure vTPM's evidence, as the collector makes it with
// IMDS's document, is accepted, and the claims name the subscription the
// document names, the VM both name, and the boot the log tells.
func TestVerify(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, azuretpm.Options{})
	sess, ev := w.attestation(t, v, w.vm)
	c, err := v.Verify(context.Background(), sess, ev)
	if err != nil {
		t.Fatal(err)
	}
	want := "azure:" + azuretpmtest.SubscriptionID + "/" + azuretpmtest.VMID
	if c.Kind != attest.KindAzureVTPM || c.Identity != want || c.NodeName != "" {
		t.Errorf("claims %s %s %q, want azure-vtpm %s", c.Kind, c.Identity, c.NodeName, want)
	}
	if c.TPM == nil || c.TPM.PCRBank != "sha256" || c.TPM.EKTrust != "azure-ak-certificate" || c.TPM.Boot.LogEvents == 0 || c.TPM.AKCertIssuer != "CN=Global Virtual TPM CA - 03" {
		t.Errorf("TPM claims %+v", c.TPM)
	}
	if len(c.TPM.PCRs) != 24 {
		t.Errorf("%d PCRs", len(c.TPM.PCRs))
	}
	if i := c.Instance; i == nil || i.Cloud != attest.CloudAzure || i.Account != azuretpmtest.SubscriptionID || i.ID != azuretpmtest.VMID || i.Location != "" {
		t.Errorf("Instance %+v, want azure %s/%s", i, azuretpmtest.SubscriptionID, azuretpmtest.VMID)
	}
	if kinds, err := attest.ParseIdentity(c.Identity); err != nil || len(kinds) != 1 || kinds[0] != attest.KindAzureVTPM {
		t.Errorf("ParseIdentity(%q) = %v, %v", c.Identity, kinds, err)
	}
}

// TestCollectorRefuses: a TPM without Azure's AK certificate, or without
// the AK, is refused on the node, before any evidence.
func TestCollectorRefuses(t *testing.T) {
	w := newWorld(t)
	for _, c := range []struct {
		name string
		o    azuretpmtest.VMOptions
		want error
	}{
		{"no AK certificate in NV 0x01C101D0", azuretpmtest.VMOptions{NoCertificate: true}, azuretpm.ErrNotAzure},
		{"no AK at 0x81000003", azuretpmtest.VMOptions{NoAK: true}, azuretpm.ErrNoAK},
	} {
		t.Run(c.name, func(t *testing.T) {
			vm := w.newVM(t, azuretpmtest.VMID, c.o)
			ch, err := vm.Dial()
			if err != nil {
				t.Fatal(err)
			}
			col, err := azuretpm.NewCollector(context.Background(), ch, azuretpm.CollectorOptions{IMDS: w.imds.Client()})
			if !errors.Is(err, c.want) {
				if col != nil {
					col.Close()
				}
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

// TestIMDSProtocol: the client speaks IMDS's protocol (the fake refuses
// anything else), and refuses answers IMDS would not give.
func TestIMDSProtocol(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	before := w.imds.Requests()
	sig, err := w.imds.Client().AttestedDocument(ctx, "abc123")
	if err != nil {
		t.Fatal(err)
	}
	d, err := azuretpm.ParseDocument(sig)
	if err != nil || d.Nonce != "abc123" || d.VMID != azuretpmtest.VMID {
		t.Fatalf("document %+v, %v", d, err)
	}
	if w.imds.Requests() != before+1 {
		t.Errorf("%d requests", w.imds.Requests()-before)
	}
	for _, c := range []struct{ name, nonce string }{
		{"nonce of 33 characters", "012345678901234567890123456789012"},
		{"nonce that is not alphanumeric", "abc-123"},
		{"empty nonce", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := w.imds.Client().AttestedDocument(ctx, c.nonce); err == nil {
				t.Error("accepted")
			}
		})
	}
	t.Run("IMDS answering another encoding", func(t *testing.T) {
		srv := httptestServer(t, `{"encoding":"base64","signature":"AAAA"}`)
		if _, err := (&azuretpm.IMDS{Endpoint: srv}).AttestedDocument(ctx, "abc"); err == nil {
			t.Error("accepted")
		}
	})
	t.Run("IMDS answering more than the bound", func(t *testing.T) {
		srv := httptestServer(t, `{"encoding":"pkcs7","signature":"`+string(make([]byte, azuretpm.MaxDocumentSize+2<<10))+`"}`)
		if _, err := (&azuretpm.IMDS{Endpoint: srv}).AttestedDocument(ctx, "abc"); err == nil {
			t.Error("accepted")
		}
	})
}
