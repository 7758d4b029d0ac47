package liveboot_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

func hexSHA256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// ownKeys is TestLiveBoot's boot with the machine's own Secure Boot keys
// (liveboot.SignerLab): kernel A re-signed by the test db signer, after
// Debian's shim and GRUB. The node re-attests (the digest policy admits
// the same code), and the claims the server recorded are checked against
// what the store holds and what the boot files say (attest/bootimage):
// the store's PK, KEK, db and dbx digests and dbx size; the shim verified
// by a certificate its own signature carries (Microsoft's UEFI CA); GRUB by
// the shim's vendor certificate (the shim's first authority); the kernel
// by one of the two authorities the shim measured (its vendor certificate
// and the test db CA, which issued the kernel's signer); MokList holding
// the test MOK CA after the vendor certificate.
func ownKeys(t *testing.T, ctx context.Context, w *world, g *liveboot.Guest, work string, dg digests, say func(string, ...any),
	boot func(name, disk, vars string) *liveboot.Result, bootNumber int64) *liveboot.Result {
	t.Helper()
	lab, err := liveboot.LoadSignerLab(ctx, testenv.Cache(), say)
	if err != nil {
		t.Fatal(err)
	}
	disk, chain, err := lab.BootDisk(ctx, liveboot.ChainTestDB, g, work)
	if err != nil {
		t.Fatal(err)
	}
	shim, err := bootimage.ReadFile(chain.Path(chain.Shim))
	if err != nil {
		t.Fatal(err)
	}
	kernel, err := bootimage.ReadFile(chain.Path(chain.Kernel))
	if err != nil {
		t.Fatal(err)
	}
	if len(shim.VendorCerts) != 1 || len(kernel.Signatures) != 1 || kernel.Signatures[0].Signer.CheckSignatureFrom(lab.Keys.DBCA.Cert) != nil {
		t.Fatalf("the chain's files: shim vendor certificates %d, kernel signatures %d (want one, by a signer the test db CA issued)", len(shim.VendorCerts), len(kernel.Signatures))
	}
	vendor := hexSHA256(shim.VendorCerts[0].Raw)

	r := boot("own-keys-"+liveboot.ChainTestDB, disk, lab.Vars.Path)
	expectLines(t, r, "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent reattest start",
		fmt.Sprintf("node %s re-attested (tpm evidence, boot %d seen by the server)", node, bootNumber), "nodeproof-liveboot: agent exit 0")
	checkLiveLog(t, r, dg, true) // the same shim, GRUB and kernel digests: re-signing keeps them

	s := w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
		if s.Binding == nil || s.Binding.Status.Boots != bootNumber || len(s.Claims) == 0 {
			return fmt.Sprintf("the binding counting boot %d, with its claims", bootNumber)
		}
		return ""
	})
	var cl attest.Claims
	if err := json.Unmarshal(s.Claims, &cl); err != nil || cl.TPM == nil {
		t.Fatalf("the recorded claims: %v", err)
	}
	b := cl.TPM.Boot
	for _, c := range []struct{ name, got, want string }{
		{"PK", b.PK, hexSHA256(lab.Vars.PK)}, {"KEK", b.KEK, hexSHA256(lab.Vars.KEK)},
		{"db", b.DB, hexSHA256(lab.Vars.DB)}, {"dbx", b.DBX, hexSHA256(lab.Vars.DBX)},
	} {
		if c.got != c.want {
			t.Errorf("%s measured %s; the store's is %s", c.name, c.got, c.want)
		}
	}
	if !b.SecureBoot || b.DBXEntries != lab.Vars.DBXEntries {
		t.Errorf("Secure Boot %v, dbx %d entries; want on, %d", b.SecureBoot, b.DBXEntries, lab.Vars.DBXEntries)
	}

	first, err := b.Signer(0)
	if err != nil {
		t.Fatal(err)
	}
	carried := false
	for _, sig := range shim.Signatures {
		for _, c := range sig.Certificates {
			carried = carried || hexSHA256(c.Raw) == first.SHA256
		}
	}
	if first.By != attest.VerifierFirmware || first.Variable != "db" || !carried {
		t.Errorf("the shim's signer %+v: want a db certificate its signature carries, measured by the firmware", first)
	}
	grub, err := b.Signer(1)
	if err != nil || grub.SHA256 != vendor || grub.By != attest.VerifierShim {
		t.Errorf("GRUB's signer %+v (%v); want the shim's vendor certificate %s", grub, err, vendor)
	}
	last := len(b.BootApplications) - 1
	if _, err := b.Signer(last); !isReason(err, attest.ReasonBootSignerAmbiguous) {
		t.Errorf("the kernel's signer: %v; want %s (the shim used two authorities)", err, attest.ReasonBootSignerAmbiguous)
	}
	if got, want := slices.Sorted(slices.Values(b.AppVerifications[last].Signers)), slices.Sorted(slices.Values([]string{vendor, lab.Keys.DBCA.SHA256()})); !slices.Equal(got, want) {
		t.Errorf("the kernel's possible signers %v; want the vendor certificate and the test db CA %v", got, want)
	}
	if !slices.ContainsFunc(b.Authorities, func(a attest.SecureBootAuthority) bool {
		return a.By == attest.VerifierShim && a.Variable == "db" && a.SHA256 == lab.Keys.DBCA.SHA256()
	}) {
		t.Errorf("no authority is the test db CA from db, measured by the shim: %+v", b.Authorities)
	}

	// The shim's MokList: its vendor certificate (one entry it owns),
	// then the MokList enrolled.
	entry := append(shimLockGUID(), shim.VendorCerts[0].Raw...)
	list := []byte{0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72}
	list = binary.LittleEndian.AppendUint32(list, uint32(28+len(entry)))
	list = binary.LittleEndian.AppendUint32(list, 0)
	list = binary.LittleEndian.AppendUint32(list, uint32(len(entry)))
	list = append(list, entry...)
	if st := b.ShimState; st == nil || st.MokList != hexSHA256(append(list, lab.Vars.MokList...)) || st.MokListOnly != "" || st.ValidationDisabled {
		t.Errorf("the shim's state %+v; want MokList the vendor certificate, then the test MOK CA", st)
	}
	say("own keys: PK %.12s…, db %.12s… (Microsoft's and the test db CA), dbx %d entries; kernel possible signers %d; took %.1fs",
		b.PK, b.DB, b.DBXEntries, len(b.AppVerifications[last].Signers), r.Took.Seconds())
	return r
}

func shimLockGUID() []byte {
	return []byte{0x50, 0xab, 0x5d, 0x60, 0x46, 0xe0, 0x00, 0x43, 0xab, 0xb6, 0x3d, 0xd8, 0x10, 0xdd, 0x8b, 0x23}
}

func isReason(err error, r attest.Reason) bool {
	got, ok := attest.ReasonOf(err)
	return ok && got == r
}
