package tpm

import (
	"crypto"
	"crypto/sha256"
	"maps"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

func TestParseSBATLevel(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		date string
		gens map[string]int
		bad  bool
	}{
		{name: "shim 15.4's original", in: "sbat,1,2021030218\n", date: "2021030218", gens: map[string]int{}},
		{name: "Debian 12's shim 16.1", in: "sbat,1,2025021800\nshim,4\ngrub,5\n", date: "2025021800", gens: map[string]int{"shim": 4, "grub": 5}},
		{name: "vendor component, no final newline", in: "sbat,1,2024010900\ngrub.debian,4", date: "2024010900", gens: map[string]int{"grub.debian": 4}},
		{name: "a trailing NUL", in: "sbat,1,2021030218\n\x00", date: "2021030218", gens: map[string]int{}},
		{name: "empty", in: "", bad: true},
		{name: "no sbat line", in: "shim,4\n", bad: true},
		{name: "header without date", in: "sbat,1\n", bad: true},
		{name: "generation not a number", in: "sbat,1,2021030218\ngrub,x\n", bad: true},
		{name: "negative generation", in: "sbat,1,2021030218\ngrub,-1\n", bad: true},
		{name: "a component twice (the second would lower it)", in: "sbat,1,2021030218\ngrub,5\ngrub,1\n", bad: true},
		{name: "an SBAT section line (six fields), not a level", in: "sbat,1,2021030218\ngrub,3,Free Software Foundation,grub,2.06,https://www.gnu.org/software/grub/\n", bad: true},
		{name: "a blank line inside", in: "sbat,1,2021030218\n\ngrub,5\n", bad: true},
		{name: "a component name with a space", in: "sbat,1,2021030218\ngr ub,5\n", bad: true},
		{name: "generation 0 (generations start at 1)", in: "sbat,1,2021030218\ngrub,0\n", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			date, gens, err := ParseSBATLevel([]byte(tc.in))
			if (err != nil) != tc.bad {
				t.Fatalf("err %v; want error %v", err, tc.bad)
			}
			if !tc.bad && (date != tc.date || !maps.Equal(gens, tc.gens)) {
				t.Fatalf("%q %v; want %q %v", date, gens, tc.date, tc.gens)
			}
		})
	}
}

func TestSignatureEntry(t *testing.T) {
	cert := derSequence(300)
	owner := shimLockGUID[:]
	hash := make([]byte, 32)
	for _, tc := range []struct {
		name              string
		in                []byte
		owner, cert, hash bool
	}{
		{name: "EFI_SIGNATURE_DATA with a certificate (firmware, shim 13 on)", in: append(append([]byte(nil), owner...), cert...), owner: true, cert: true},
		{name: "a bare certificate (old shims)", in: cert, cert: true},
		{name: "EFI_SIGNATURE_DATA with a SHA-256 hash", in: append(append([]byte(nil), owner...), hash...), owner: true, hash: true},
		{name: "EFI_SIGNATURE_DATA with a SHA-1 hash", in: append(append([]byte(nil), owner...), hash[:20]...), owner: true, hash: true},
		{name: "a certificate cut short", in: cert[:len(cert)-1]},
		{name: "a certificate with a byte more", in: append(append([]byte(nil), cert...), 0)},
		{name: "nothing", in: nil},
		{name: "an owner alone", in: owner},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, c, h, ok := signatureEntry(tc.in)
			if ok != (tc.cert || tc.hash) || (o != nil) != tc.owner || (c != nil) != tc.cert || (h != nil) != tc.hash {
				t.Fatalf("owner %x cert %d bytes hash %x ok %v", o, len(c), h, ok)
			}
		})
	}
}

// derSequence is a DER SEQUENCE of n bytes in all (long-form length).
func derSequence(n int) []byte {
	body := n - 4
	return append([]byte{0x30, 0x82, byte(body >> 8), byte(body)}, make([]byte, body)...)
}

func TestIsDERSequence(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want bool
	}{
		{"short form", []byte{0x30, 0x02, 0x05, 0x00}, true},
		{"long form", derSequence(1200), true},
		{"long form for a short length (not DER)", []byte{0x30, 0x81, 0x02, 0x05, 0x00}, false},
		{"leading zero length byte (not DER)", []byte{0x30, 0x82, 0x00, 0x02, 0x05, 0x00}, false},
		{"indefinite length", []byte{0x30, 0x80, 0x00, 0x00}, false},
		{"five length bytes", []byte{0x30, 0x85, 1, 0, 0, 0, 0}, false},
		{"not a SEQUENCE", []byte{0x31, 0x00}, false},
		{"length past the end", []byte{0x30, 0x05, 0x00}, false},
		{"empty", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := isDERSequence(tc.in); got != tc.want {
				t.Fatalf("%v; want %v", got, tc.want)
			}
		})
	}
}

func TestGUIDString(t *testing.T) {
	if got := guidString(shimLockGUID[:]); got != "605dab50-e046-4300-abb6-3dd810dd8b23" {
		t.Fatal(got)
	}
}

// TestPlaceholderDigest: the shim's empty key list has the digest real
// logs show for an empty MokListX (cos-121, ubuntu-2404).
func TestPlaceholderDigest(t *testing.T) {
	const want = "8d8a3aae50d5d25838c95c034aadce7b548c9a952eb7925e366eda537c59c3b0"
	if got := placeholderDigest(crypto.SHA256); got == nil || hexOf(got) != want {
		t.Fatalf("%x", got)
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 2*len(b))
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&15]
	}
	return string(out)
}

func FuzzSBATLevel(f *testing.F) {
	f.Add([]byte("sbat,1,2025021800\nshim,4\ngrub,5\n"))
	f.Add([]byte("sbat,1,2021030218\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		date, gens, err := ParseSBATLevel(b)
		if err != nil {
			return
		}
		if !digits(date) || len(gens) > maxSBATLines {
			t.Fatalf("date %q, %d components", date, len(gens))
		}
		for c, g := range gens {
			if !componentName(c) || g < 1 {
				t.Fatalf("component %q generation %d", c, g)
			}
		}
	})
}

func FuzzSignatureEntry(f *testing.F) {
	f.Add(append(append([]byte(nil), shimLockGUID[:]...), derSequence(200)...))
	f.Add(derSequence(100))
	f.Add(make([]byte, 48))
	f.Fuzz(func(t *testing.T, b []byte) {
		owner, cert, hash, ok := signatureEntry(b)
		if !ok {
			return
		}
		if (cert == nil) == (hash == nil) || len(owner)+len(cert)+len(hash) != len(b) || cert != nil && !isDERSequence(cert) {
			t.Fatalf("owner %d, cert %d, hash %d bytes of %d", len(owner), len(cert), len(hash), len(b))
		}
	})
}

// TestSignerLookup: BootState.Signer names the authority its verifier
// measured, and says why when it cannot.
func TestSignerLookup(t *testing.T) {
	fp := func(s string) string { h := sha256.Sum256([]byte(s)); return hexOf(h[:]) }
	bs := attest.BootState{
		BootApplications: []string{"a", "b", "c", "d"},
		Authorities: []attest.SecureBootAuthority{
			{Variable: "db", By: attest.VerifierFirmware, SHA256: fp("ca")},
			{Variable: "db", By: attest.VerifierShim, SHA256: fp("ca")},
			{Variable: "MokListRT", By: attest.VerifierShim, SHA256: fp("mok")},
		},
		AppVerifications: []attest.AppVerification{
			{Verifier: attest.VerifierFirmware, Signers: []string{fp("ca")}},
			{Verifier: attest.VerifierShim, Signers: []string{fp("ca"), fp("mok")}},
			{Verifier: attest.VerifierShim},
			{},
		},
	}
	a, err := bs.Signer(0)
	if err != nil || a.By != attest.VerifierFirmware {
		t.Fatalf("%+v %v", a, err)
	}
	for i, want := range map[int]attest.Reason{1: attest.ReasonBootSignerAmbiguous, 2: attest.ReasonBootSignerUnknown, 3: attest.ReasonBootSignerUnknown, 4: attest.ReasonBootSignerUnknown} {
		if _, err := bs.Signer(i); !isReason(err, want) {
			t.Errorf("application %d: %v; want %s", i, err, want)
		}
	}
}

func isReason(err error, r attest.Reason) bool {
	got, ok := attest.ReasonOf(err)
	return ok && got == r
}

// TestShimStateOfRealLogs: what the shim's PCR 14 measurements say on
// real logs: Debian's and Red Hat's MokList hold exactly their vendor
// certificate (the one that verified GRUB and the kernel: no machine-owner
// key), COS's shim has an empty MokList, and MokListTrusted reads as on.
func TestShimStateOfRealLogs(t *testing.T) {
	for _, tc := range []struct {
		log         string
		only        bool // MokList holds exactly the shim's authority
		empty       bool
		trustedKnow bool
	}{
		{log: "debian-12-ovmf-secure-boot", only: true, trustedKnow: true},
		{log: "rhel8-uefi", only: true},
		{log: "cos-121-amd-sev", empty: true, trustedKnow: true},
	} {
		t.Run(tc.log, func(t *testing.T) {
			bs, err := LogBootState(firmwaretestdata.MustLog(tc.log), crypto.SHA256)
			if err != nil {
				t.Fatal(err)
			}
			st := bs.ShimState
			if st == nil {
				t.Fatal("no shim state")
			}
			kernel, err := bs.Signer(len(bs.BootApplications) - 1)
			if err != nil {
				t.Fatal(err)
			}
			if (st.MokListOnly == kernel.SHA256) != tc.only || (st.MokListOnly != "") != tc.only || st.MokListEmpty != tc.empty ||
				st.MokListTrustedKnown != tc.trustedKnow || (tc.trustedKnow && !st.MokListTrustedOn) || st.ValidationDisabled {
				t.Fatalf("shim state %+v (the kernel's signer %s)", st, kernel.SHA256)
			}
		})
	}
}
