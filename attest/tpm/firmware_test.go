package tpm_test

import (
	"crypto"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	goattest "github.com/google/go-attestation/attest"
	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// TestFirmwareLogs runs every real firmware log of firmware-testdata through
// the real flow on the simulator and checks the verifier's outcome against
// the expectation established independently of this package
// (firmware-testdata/README.md says how):
//   - a SHA-256 log that a TPM started at locality 0 reproduces: accepted,
//     and the claims' boot state is the expected one;
//   - a SHA-256 log that such a TPM cannot reproduce (locality-3 startup,
//     H-CRTM, DRTM PCRs): the simulator's PCRs differ from the log, so the
//     verifier refuses it as a replay mismatch rather than trusting part of
//     it;
//   - a SHA-1-only log: it matches the simulator's SHA-1 bank, but the
//     collector quotes the SHA-256 bank, which a SHA-1 log cannot replay
//     against: refused (accepted with nothing established when the log
//     measures nothing);
//   - a log that does not parse: refused as malformed.
//
// The simulator is one per process: no t.Parallel.
func TestFirmwareLogs(t *testing.T) {
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	if len(logs) == 0 {
		t.Fatal("no firmware logs")
	}
	for _, l := range logs {
		t.Run(l.Name, func(t *testing.T) {
			exp := l.Expected
			el, perr := tcg.ParseEventLog(l.Raw, tcg.ParseOpts{AllowPadding: true})
			if (perr == nil) != exp.Parses {
				t.Fatalf("go-eventlog parse error %v; expected parses=%v", perr, exp.Parses)
			}
			ca := newCA(t, "Vendor")
			switch {
			case !exp.Parses:
				// Nothing to extend: the TPM is fresh and the node sends the
				// unparsable log.
				m := newMachine(t, ca, nil)
				m.ch.log = l.Raw
				_, err := attestOnce(t, m, newVerifier(t, ca, nil))
				wantReason(t, err, attest.ReasonEventLogInvalid)

			case exp.SHA256 && exp.SwTPMReplay:
				m := newMachine(t, ca, l.Raw)
				claims, err := attestOnce(t, m, newVerifier(t, ca, nil))
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				checkBoot(t, claims, exp)
				checkLivePCRs(t, claims, exp)

			case exp.SHA256:
				m := newMachine(t, ca, l.Raw)
				_, err := attestOnce(t, m, newVerifier(t, ca, nil))
				wantReason(t, err, attest.ReasonEventLogReplay)

			default:
				m := newMachine(t, ca, l.Raw)
				measured := sha1Replay(t, m, el)
				claims, err := attestOnce(t, m, newVerifier(t, ca, nil))
				if measured > 0 {
					wantReason(t, err, attest.ReasonEventLogReplay)
					return
				}
				if err != nil {
					t.Fatalf("log measuring nothing refused: %v", err)
				}
				b := claims.TPM.Boot
				if b.LogEvents != 0 || len(b.ReplayedPCRs) != 0 || b.SecureBootKnown || b.DBXKnown || b.KernelCmdlineKnown || len(b.BootApplications) != 0 {
					t.Fatalf("a log measuring nothing established %+v", b)
				}
			}
		})
	}
}

// checkBoot compares the claims' boot state with the expectation.
func checkBoot(t *testing.T, claims *attest.Claims, exp firmwaretestdata.Expected) {
	t.Helper()
	if claims.TPM == nil {
		t.Fatal("no TPM claims")
	}
	if claims.TPM.PCRBank != "sha256" {
		t.Errorf("PCR bank %q; want sha256", claims.TPM.PCRBank)
	}
	b := claims.TPM.Boot
	if b.LogEvents == 0 {
		t.Error("no event replayed")
	}
	// The collector quotes PCRs 0-23, so every PCR with events in the log is
	// checked; the log was extended into PCRs 0-16 only, and a log with
	// events above 16 would not have replayed (swtpmReplay is false for
	// those). So the replayed PCRs are exactly the expected ones (0-16).
	var want []int
	for _, i := range exp.ReplayPCRs {
		if i <= 16 {
			want = append(want, i)
		}
	}
	if !slices.Equal(b.ReplayedPCRs, want) {
		t.Errorf("replayed PCRs %v; want %v", b.ReplayedPCRs, want)
	}

	switch exp.SecureBoot {
	case "on":
		if !b.SecureBootKnown || !b.SecureBoot {
			t.Errorf("secure boot known=%v on=%v; want on", b.SecureBootKnown, b.SecureBoot)
		}
	case "off":
		if !b.SecureBootKnown || b.SecureBoot {
			t.Errorf("secure boot known=%v on=%v; want off", b.SecureBootKnown, b.SecureBoot)
		}
	case "unknown":
		if b.SecureBootKnown {
			t.Errorf("secure boot known (on=%v); want unknown", b.SecureBoot)
		}
	default:
		t.Fatalf("expected secureBoot %q is none of on, off, unknown", exp.SecureBoot)
	}

	if exp.DBXEntries < 0 {
		if b.DBXKnown {
			t.Errorf("dbx known with %d entries; want not measured", b.DBXEntries)
		}
	} else {
		if !b.DBXKnown || b.DBXEntries != exp.DBXEntries {
			t.Errorf("dbx known=%v entries=%d; want %d entries", b.DBXKnown, b.DBXEntries, exp.DBXEntries)
		}
		if len(b.DBXSHA256s)%32 != 0 || len(b.DBXSHA256s)/32 > b.DBXEntries {
			t.Errorf("%d bytes of dbx SHA-256 entries for %d entries", len(b.DBXSHA256s), b.DBXEntries)
		}
	}

	if !slices.Equal(b.BootApplications, exp.BootApplications) {
		t.Errorf("boot applications %v; want %v", b.BootApplications, exp.BootApplications)
	}
	checkSecureBoot(t, b, exp)
	if exp.KernelCmdline == "" {
		if b.KernelCmdlineKnown {
			t.Errorf("kernel command line %q; want none", b.KernelCmdline)
		}
	} else if !b.KernelCmdlineKnown || b.KernelCmdline != exp.KernelCmdline {
		t.Errorf("kernel command line known=%v %q; want %q", b.KernelCmdlineKnown, b.KernelCmdline, exp.KernelCmdline)
	}
	var sections []firmwaretestdata.UKISection
	for _, s := range b.UKISections {
		sections = append(sections, firmwaretestdata.UKISection{Name: s.Path, SHA256: s.Digest})
	}
	if b.UKISectionsKnown != (len(exp.UKISections) > 0) || !slices.Equal(sections, exp.UKISections) {
		t.Errorf("UKI sections known=%v %v; want %v", b.UKISectionsKnown, sections, exp.UKISections)
	}
}

// checkLivePCRs: a live boot's log (internal/liveboot) comes with the
// PCRs the booted kernel showed; extended into a fresh TPM and quoted, it
// must give them.
func checkLivePCRs(t *testing.T, claims *attest.Claims, exp firmwaretestdata.Expected) {
	t.Helper()
	for idx, want := range exp.PCRs {
		i, err := strconv.Atoi(idx)
		if err != nil {
			t.Fatalf("expected pcrs key %q", idx)
		}
		if got := claims.TPM.PCRs[i]; got != want {
			t.Errorf("PCR %d is %s after replaying the log; the live machine's was %s", i, got, want)
		}
	}
}

// sha1Replay checks that a SHA-1-only log replays against the simulator's
// SHA-1 bank (what a SHA-1 quote would cover) and returns the number of
// events that replayed.
func sha1Replay(t *testing.T, m *machine, el *tcg.EventLog) int {
	t.Helper()
	at, err := goattest.OpenTPM(&goattest.OpenConfig{CommandChannel: noClose{m.ch}})
	if err != nil {
		t.Fatal(err)
	}
	defer at.Close()
	pcrs, err := at.PCRs(goattest.HashSHA1)
	if err != nil {
		t.Fatal(err)
	}
	var mrs []register.MR
	for _, p := range pcrs {
		mrs = append(mrs, register.PCR{Index: p.Index, Digest: p.Digest, DigestAlg: crypto.SHA1})
	}
	events, err := el.Verify(mrs)
	if err != nil {
		t.Fatalf("SHA-1 log does not replay against the simulator's SHA-1 bank: %v", err)
	}
	return len(events)
}

// checkSecureBoot compares the claims' Secure Boot authorities, each boot
// application's signer and the shim's measurements with the expectation
// (read with go-eventlog alone: firmwaretestdata's ReadSecureBoot).
func checkSecureBoot(t *testing.T, b attest.BootState, exp firmwaretestdata.Expected) {
	t.Helper()
	var got []firmwaretestdata.Authority
	for _, a := range b.Authorities {
		got = append(got, firmwaretestdata.Authority{By: a.By, Variable: a.Variable, SHA256: a.SHA256, Subject: a.Subject})
	}
	if !slices.Equal(got, exp.Authorities) {
		t.Errorf("authorities %+v; want %+v", got, exp.Authorities)
	}
	if len(b.AppVerifications) != len(b.BootApplications) {
		t.Fatalf("%d verifications for %d boot applications", len(b.AppVerifications), len(b.BootApplications))
	}
	for i := range b.BootApplications {
		a, err := b.Signer(i)
		switch {
		case len(exp.Signers) == 0 && err == nil:
			t.Errorf("application %d: signer %s with Secure Boot %s", i, a.Subject, exp.SecureBoot)
		case len(exp.Signers) > 0 && (err != nil || a.SHA256 != exp.Signers[i]):
			t.Errorf("application %d: signer %s (%v); want %s", i, a.SHA256, err, exp.Signers[i])
		}
	}
	st := b.ShimState
	if st == nil {
		st = &attest.ShimState{}
	}
	if st.MokList != exp.MokList || st.MokListX != exp.MokListX || st.MokListTrusted != exp.MokListTrusted {
		t.Errorf("MokList %q MokListX %q MokListTrusted %q; want %q %q %q", st.MokList, st.MokListX, st.MokListTrusted, exp.MokList, exp.MokListX, exp.MokListTrusted)
	}
	if exp.SbatLevel == "" {
		if st.SBATLevelKnown {
			t.Errorf("SBAT level %s %v; the log has none", st.SBATDate, st.SBAT)
		}
		return
	}
	lines := strings.Split(strings.TrimSuffix(exp.SbatLevel, "\n"), "\n")
	want := map[string]int{}
	for _, l := range lines[1:] {
		c, g, _ := strings.Cut(l, ",")
		want[c], _ = strconv.Atoi(g)
	}
	if !st.SBATLevelKnown || "sbat,1,"+st.SBATDate != lines[0] || !maps.Equal(st.SBAT, want) {
		t.Errorf("SBAT level known %v, %s %v; want %q", st.SBATLevelKnown, st.SBATDate, st.SBAT, exp.SbatLevel)
	}
}
