package tpm

import (
	"crypto"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// uefiVar encodes a UEFI_VARIABLE_DATA for seeds.
func uefiVar(name string, data []byte) []byte {
	u := utf16.Encode([]rune(name))
	b := make([]byte, 32, 32+2*len(u)+len(data))
	binary.LittleEndian.PutUint64(b[16:], uint64(len(u)))
	binary.LittleEndian.PutUint64(b[24:], uint64(len(data)))
	for _, c := range u {
		b = binary.LittleEndian.AppendUint16(b, c)
	}
	return append(b, data...)
}

// sigList encodes one EFI_SIGNATURE_LIST of SHA-256 entries.
func sigList(n int) []byte {
	b := append([]byte(nil), efiCertSHA256GUID...)
	b = binary.LittleEndian.AppendUint32(b, uint32(28+n*48))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 48)
	for i := 0; i < n; i++ {
		b = append(b, make([]byte, 16)...)
		h := make([]byte, 32)
		h[0] = byte(i)
		b = append(b, h...)
	}
	return b
}

func TestSignatureLists(t *testing.T) {
	cases := []struct {
		name    string
		in      []byte
		entries int
		hashes  int
		wantErr bool
	}{
		{"empty", nil, 0, 0, false},
		{"three SHA-256 entries", sigList(3), 3, 3, false},
		{"two lists", append(sigList(2), sigList(1)...), 3, 3, false},
		{"truncated", sigList(3)[:100], 0, 0, true},
		{"header only", sigList(3)[:20], 0, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, h, err := signatureLists(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err == nil && (n != tc.entries || len(h) != 32*tc.hashes) {
				t.Fatalf("%d entries, %d hash bytes; want %d, %d", n, len(h), tc.entries, 32*tc.hashes)
			}
		})
	}
}

func FuzzSignatureLists(f *testing.F) {
	f.Add(sigList(2))
	f.Add(append(sigList(1), sigList(3)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, h, err := signatureLists(b)
		if err == nil && (len(h)%32 != 0 || len(h)/32 > n) {
			t.Fatalf("%d entries but %d hash bytes", n, len(h))
		}
	})
}

func FuzzParseUEFIVariable(f *testing.F) {
	f.Add(uefiVar("SecureBoot", []byte{1}))
	f.Add(uefiVar("dbx", sigList(2)))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parseUEFIVariable(b)
		if err == nil && 32+2*len(v.name)+len(v.data) > len(b) {
			t.Fatal("parsed more than was there")
		}
	})
}

// FuzzBootState feeds logs through parse, replay and extraction with the
// PCR values the log's own digests extend to (pcrsOf), so replay succeeds
// and the extraction code sees hostile event data. Seeds: every real
// firmware log in firmware-testdata. Properties: a refusal is one of the
// event log's reasons; an accepted log has the boot's order, each PCR read
// alone (checkBootOrder); the boot state counts the replayed events, names
// only replayed PCRs 0-16 (sorted, once each), and its derived fields
// agree with what they derive from.
func FuzzBootState(f *testing.F) {
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		f.Fatal(err)
	}
	for _, l := range logs {
		f.Add(l.Raw)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		quoted := pcrsOf(raw)
		if quoted == nil {
			quoted = map[int][]byte{0: make([]byte, 32), 7: make([]byte, 32)}
		}
		// Two thirds of the inputs as a machine whose systemd then measured
		// enter-initrd into PCR 11: the phase must be read back, and
		// nothing else accepted differently.
		var wantPhases []string
		if len(raw)%3 != 0 && logsPCR11(raw) {
			w := sha256.Sum256([]byte("enter-initrd"))
			v := sha256.Sum256(append(slices.Clone(quoted[11]), w[:]...))
			quoted[11], wantPhases = v[:], []string{"enter-initrd"}
		}
		events, phases, err := replayLog(raw, crypto.SHA256, quoted)
		if err != nil {
			if wantPhases != nil {
				if _, _, plain := replayLog(raw, crypto.SHA256, pcrsOf(raw)); plain == nil {
					t.Fatalf("the log replays, but not with enter-initrd after it on PCR 11: %v", err)
				}
			}
			wantReasonIn(t, err, attest.ReasonEventLogInvalid, attest.ReasonEventLogReplay)
			return
		}
		if len(events) > 0 && !slices.Equal(phases, wantPhases) {
			t.Fatalf("phases read %q; want %q", phases, wantPhases)
		}
		bs, err := bootState(events, crypto.SHA256)
		if err != nil {
			wantReasonIn(t, err, attest.ReasonEventLogInvalid, attest.ReasonEventLogOutOfOrder, attest.ReasonEventLogVariableRepeated,
				attest.ReasonEventLogVariableGUID, attest.ReasonEventLogUnexpected, attest.ReasonUEFIDebugger)
			return
		}
		checkBootState(t, bs, events)
		checkBootOrder(t, bs, events)
	})
}

// logsPCR11 reports whether raw parses and has events in PCR 11.
func logsPCR11(raw []byte) bool {
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	return err == nil && impliedPCRs(el, crypto.SHA256)[11] != nil
}

func checkBootState(t *testing.T, bs attest.BootState, events []tcg.Event) {
	t.Helper()
	if bs.LogEvents != len(events) {
		t.Fatalf("%d events counted, %d replayed", bs.LogEvents, len(events))
	}
	seen := map[int]bool{}
	for _, e := range events {
		seen[e.Index] = true
	}
	for i, p := range bs.ReplayedPCRs {
		if p < 0 || p > lastSRTMPCR || !seen[p] || (i > 0 && bs.ReplayedPCRs[i-1] >= p) {
			t.Fatalf("replayed PCRs %v", bs.ReplayedPCRs)
		}
	}
	// The chain is PCR 2's and PCR 4's digests that are not their own
	// data's hash, each PCR's after its separator (all of PCR 4's without
	// one): never more, and what the types say plays no part.
	images := 0
	for _, e := range events {
		if (e.Index == 2 || e.Index == 4) && !dataMatchesDigest(e.Data, e.Digest, crypto.SHA256) && !dataMatchesDigest([]byte{0, 0, 0, 0}, e.Digest, crypto.SHA256) {
			images++
		}
	}
	switch {
	case len(bs.BootApplications)+len(bs.OtherImages) != images:
		t.Fatalf("%d boot applications and %d other images for %d image digests in PCRs 2 and 4", len(bs.BootApplications), len(bs.OtherImages), images)
	case bs.SecureBoot && !bs.SecureBootKnown:
		t.Fatal("secure boot on but unknown")
	case !bs.KernelCmdlineKnown && bs.KernelCmdline != "":
		t.Fatal("a command line that is not known")
	case len(bs.DBXSHA256s)%32 != 0 || len(bs.DBXSHA256s)/32 > bs.DBXEntries:
		t.Fatalf("%d dbx entries, %d hash bytes", bs.DBXEntries, len(bs.DBXSHA256s))
	case !bs.DBXKnown && (bs.DBXEntries != 0 || bs.DBX != ""):
		t.Fatal("dbx not measured but described")
	}
	checkAuthorities(t, bs)
}

// checkAuthorities: every boot application has a verification; each
// signer is a listed authority its verifier measured; nothing verified
// anything with Secure Boot off; the shim's state describes only what it
// measured.
func checkAuthorities(t *testing.T, bs attest.BootState) {
	t.Helper()
	if len(bs.AppVerifications) != len(bs.BootApplications) {
		t.Fatalf("%d verifications for %d boot applications", len(bs.AppVerifications), len(bs.BootApplications))
	}
	by := map[string]bool{}
	for _, a := range bs.Authorities {
		if a.By != attest.VerifierFirmware && a.By != attest.VerifierShim || a.SHA256 == "" {
			t.Fatalf("authority %+v", a)
		}
		by[a.By+" "+a.SHA256] = true
	}
	for i, v := range bs.AppVerifications {
		if v.Verifier == "" && len(v.Signers) > 0 || v.Verifier != "" && !(bs.SecureBootKnown && bs.SecureBoot) {
			t.Fatalf("application %d: %+v with Secure Boot known %v on %v", i, v, bs.SecureBootKnown, bs.SecureBoot)
		}
		for _, s := range v.Signers {
			if !by[v.Verifier+" "+s] {
				t.Fatalf("application %d: signer %s is no authority the %s measured", i, s, v.Verifier)
			}
		}
		a, err := bs.Signer(i)
		r, _ := attest.ReasonOf(err)
		switch {
		case len(v.Signers) == 1 && (err != nil || a.SHA256 != v.Signers[0] || a.By != v.Verifier):
			t.Fatalf("application %d: one signer %s, Signer says %+v, %v", i, v.Signers[0], a, err)
		case len(v.Signers) > 1 && r != attest.ReasonBootSignerAmbiguous, len(v.Signers) == 0 && r != attest.ReasonBootSignerUnknown:
			t.Fatalf("application %d: %d signers, Signer says %v", i, len(v.Signers), err)
		}
	}
	if st := bs.ShimState; st != nil {
		if !st.SBATLevelKnown && (st.SBATDate != "" || len(st.SBAT) > 0) || st.MokListOnly != "" && st.MokList == "" ||
			st.MokListEmpty && st.MokList == "" || st.MokListXEmpty && st.MokListX == "" {
			t.Fatalf("shim state %+v", st)
		}
	}
}

// checkBootOrder: an accepted log is in the boot's order, each PCR read
// alone: one separator a PCR 0-7 (by its digest), nothing in PCR 5 after
// ExitBootServices but its "Returned" actions, no Secure Boot variable in
// PCR 7 after its separator.
func checkBootOrder(t *testing.T, bs attest.BootState, events []tcg.Event) {
	t.Helper()
	var ebs bool
	var sep [8]int
	is := func(e tcg.Event, text string) bool { return dataMatchesDigest([]byte(text), e.Digest, crypto.SHA256) }
	for _, e := range events {
		switch {
		case e.Index == 5 && ebs && !is(e, actionEBSReturned) && !is(e, actionEBSFailed):
			t.Fatalf("an event in PCR 5 after ExitBootServices was accepted")
		case e.Index == 5 && is(e, actionEBS):
			ebs = true
		case e.Index <= 7 && is(e, "\x00\x00\x00\x00"):
			if sep[e.Index]++; sep[e.Index] > 1 {
				t.Fatalf("two separators in PCR %d accepted", e.Index)
			}
		case e.Index == 7 && sep[7] > 0 && dataMatchesDigest(e.Data, e.Digest, crypto.SHA256):
			if v, err := parseUEFIVariable(e.Data); err == nil && isSecureBootVariable(v.String()) && !isSignatureEntry(v.data) {
				t.Fatalf("the Secure Boot variable %s in PCR 7 after its separator accepted", v.String())
			}
		}
	}
	if ebs != bs.ExitBootServices {
		t.Fatalf("ExitBootServices %v, PCR 5 says %v", bs.ExitBootServices, ebs)
	}
}

// FuzzVerifierInputs sends arbitrary bytes as every field of both messages;
// the verifier must refuse with a typed reason and never panic.
func FuzzVerifierInputs(f *testing.F) {
	f.Add([]byte{}, []byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, ekPub, ekCert, akPub, quote []byte) {
		v, err := NewVerifier(Options{Clock: func() time.Time { return time.Unix(1e9, 0) }})
		if err != nil {
			t.Fatal(err)
		}
		req := &ChallengeRequest{EKPublic: ekPub, EKCertificate: ekCert, AK: AKParameters{Public: akPub, CreateData: quote, CreateAttestation: quote, CreateSignature: quote}}
		if _, _, err := v.Challenge("p", make([]byte, 32), req); err != nil {
			if _, ok := attest.ReasonOf(err); !ok {
				t.Fatalf("untyped refusal: %v", err)
			}
		}
		sess := &attest.Session{Kind: attest.KindTPM, Nonce: make([]byte, 32), KubeletKeySHA256: make([]byte, 32), Expires: time.Unix(2e9, 0), State: akPub}
		ev := &Evidence{KubeletKeySHA256: ekPub, ActivationSecret: ekCert, Quotes: []Quote{{Quote: quote, Signature: akPub}}, EventLog: quote}
		if _, err := v.Verify(sess, ev); err != nil {
			if _, ok := attest.ReasonOf(err); !ok {
				t.Fatalf("untyped refusal: %v", err)
			}
		}
	})
}
