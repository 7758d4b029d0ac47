package tpm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	goattest "github.com/google/go-attestation/attest"
	"github.com/google/go-tpm/legacy/tpm2"
	tpm2new "github.com/google/go-tpm/tpm2"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// The fuzz targets of what the verifier decodes from a node: the EK
// certificate, the AK's public area, creation data and attestation, the
// quote and its signature, and the whole second message against a real
// session. Seeds are real: the exchanges captured from swtpm and the
// go-tpm-tools simulator (testdata/exchanges), Google's EK CA certificates
// (testdata/ekcerts) and the Windows Shielded VM attestation that ships
// with go-attestation (firmware-testdata).

// wantReasonIn fails unless err is a Denial with one of reasons.
func wantReasonIn(t *testing.T, err error, reasons ...attest.Reason) {
	t.Helper()
	r, ok := attest.ReasonOf(err)
	if !ok {
		t.Fatalf("untyped refusal: %v", err)
	}
	if !slices.Contains(reasons, r) {
		t.Fatalf("refused %s (%v); want one of %v", r, err, reasons)
	}
}

// googleEKCAs reads Google's EK CA certificates: the roots and the
// intermediates as a RootSet, and every file's DER (for seeds).
func googleEKCAs(tb testing.TB) (RootSet, [][]byte) {
	tb.Helper()
	names, err := filepath.Glob("testdata/ekcerts/google/*")
	if err != nil || len(names) == 0 {
		tb.Fatalf("no Google EK CA certificates: %v", err)
	}
	sort.Strings(names)
	set := RootSet{Name: "google"}
	var ders [][]byte
	for _, n := range names {
		der, err := os.ReadFile(n)
		if err != nil {
			tb.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			tb.Fatalf("%s: %v", n, err)
		}
		if bytes.Equal(c.RawIssuer, c.RawSubject) {
			set.Roots = append(set.Roots, c)
		} else {
			set.Intermediates = append(set.Intermediates, c)
		}
		ders = append(ders, der)
	}
	return set, ders
}

// nvWrap stores der as TPMs keep it in NV: the TCG header in front and
// padding behind.
func nvWrap(der []byte) []byte {
	b := append([]byte{0x10, 0x01, 0x00}, binary.BigEndian.AppendUint16(nil, uint16(len(der)))...)
	b = append(b, der...)
	return append(b, bytes.Repeat([]byte{0xff}, 32)...)
}

// FuzzEKCertificate feeds EK certificates (as read from NV: DER, with or
// without the TCG header and padding) and one intermediate the node sends
// to the EK check, with the EK public key taken from the certificate (so
// the fuzzer gets past the key comparison) or the real one. Properties:
//   - a refusal is one of the EK reasons;
//   - the intermediate cache changes nothing: a verifier that has seen
//     every earlier input (warm) and a fresh one (cold) agree;
//   - an accepted certificate parses, holds exactly the EK public key, is
//     valid at the verifier's time, is not a CA certificate, and chains to
//     one of the configured vendors.
func FuzzEKCertificate(f *testing.F) {
	xs := LoadExchanges(f)
	google, googleDER := googleEKCAs(f)
	type ekCtx struct {
		warm  *ekTrust
		sets  []RootSet
		now   time.Time
		ekPub []byte
	}
	var ctxs []ekCtx
	for i := range xs {
		x := &xs[i]
		sets := []RootSet{x.RootSet(f), google}
		ctxs = append(ctxs, ekCtx{warm: newEKTrust(sets, nil), sets: sets, now: x.Time, ekPub: x.Request.EKPublic})
		cert := x.Request.EKCertificate
		f.Add(uint8(i), cert, []byte(nil), true)
		f.Add(uint8(i), nvWrap(cert), []byte(nil), true)
		f.Add(uint8(i), cert, []byte(nil), false)
		for _, inter := range x.Intermediates {
			f.Add(uint8(i), cert, inter, true)
		}
	}
	for _, der := range googleDER {
		f.Add(uint8(0), der, []byte(nil), true)
		f.Add(uint8(0), xs[0].Request.EKCertificate, der, true)
	}
	f.Fuzz(func(t *testing.T, which uint8, cert, inter []byte, ownKey bool) {
		c := ctxs[int(which)%len(ctxs)]
		ekPub := c.ekPub
		if ownKey {
			if pc, err := goattest.ParseEKCertificate(cert); err == nil {
				if der, err := x509.MarshalPKIXPublicKey(pc.PublicKey); err == nil {
					ekPub = der
				}
			}
		}
		var inters [][]byte
		if len(inter) > 0 {
			inters = [][]byte{inter}
		}
		facts, err := c.warm.check(ekPub, cert, inters, c.now)
		cold, cerr := newEKTrust(c.sets, nil).check(ekPub, cert, inters, c.now)
		if (err == nil) != (cerr == nil) {
			t.Fatalf("the intermediate cache changed the outcome: warm %v, cold %v", err, cerr)
		}
		if err != nil {
			wantReasonIn(t, err, attest.ReasonMalformed, attest.ReasonEKNotInInventory, attest.ReasonEKCertInvalid,
				attest.ReasonEKMismatch, attest.ReasonEKUntrusted)
			return
		}
		pc, perr := goattest.ParseEKCertificate(cert)
		if perr != nil {
			t.Fatalf("accepted a certificate that does not parse: %v", perr)
		}
		der, _ := x509.MarshalPKIXPublicKey(pc.PublicKey)
		switch {
		case !bytes.Equal(der, ekPub):
			t.Fatal("accepted a certificate for another key")
		case facts.SHA256 != sha256.Sum256(ekPub):
			t.Fatal("EK hash is not the EK's")
		case c.now.Before(pc.NotBefore) || c.now.After(pc.NotAfter):
			t.Fatalf("accepted a certificate valid %s to %s at %s", pc.NotBefore, pc.NotAfter, c.now)
		case pc.IsCA || pc.KeyUsage&x509.KeyUsageCertSign != 0:
			t.Fatalf("accepted a CA certificate (%s) as an EK certificate", pc.Subject)
		case facts.Trust != cold.Trust || (facts.Trust != "ca:vendor" && facts.Trust != "ca:google"):
			t.Fatalf("trust %q (cold %q)", facts.Trust, cold.Trust)
		}
	})
}

// windowsAttestation is go-attestation's Windows Shielded VM dump (an RSA
// AK, a SHA-1 quote of all 24 PCRs with empty qualifying data).
func windowsAttestation(tb testing.TB) (AKParameters, Quote, []PCR) {
	tb.Helper()
	var d struct {
		AK    struct{ Public, CreateData, CreateAttestation, CreateSignature []byte }
		Quote struct{ Quote, Signature []byte }
		Log   struct {
			PCRs []struct {
				Index     int
				Digest    []byte
				DigestAlg crypto.Hash
			}
		}
	}
	if err := json.Unmarshal(firmwaretestdata.WindowsGCPShieldedVM(), &d); err != nil {
		tb.Fatal(err)
	}
	var pcrs []PCR
	for _, p := range d.Log.PCRs {
		pcrs = append(pcrs, PCR{Index: p.Index, Bank: bankName(p.DigestAlg), Digest: p.Digest})
	}
	return AKParameters{Public: d.AK.Public, CreateData: d.AK.CreateData, CreateAttestation: d.AK.CreateAttestation, CreateSignature: d.AK.CreateSignature},
		Quote{Quote: d.Quote.Quote, Signature: d.Quote.Signature}, pcrs
}

// FuzzTPMStructures feeds the TPM structures a node sends — the AK's
// TPMT_PUBLIC, TPMS_CREATION_DATA, the creation TPMS_ATTEST and its
// TPMT_SIGNATURE, a quote's TPMS_ATTEST and TPMT_SIGNATURE, with the
// binding and PCR values to check them against — through the verifier's
// decoding and checks. Seeds are real structures (swtpm and the simulator,
// ECDSA AKs that pass; a Windows Shielded VM's RSA AK, SHA-1, refused). Properties: every refusal has its check's reason;
// an accepted AK is a restricted, fixedTPM, non-decrypting signing key of
// allowed strength; an accepted creation attestation is TPM_GENERATED,
// names this AK and digests exactly the creation data; an accepted quote
// binds exactly the binding, covers the required PCRs and its digest is
// that of the values sent.
func FuzzTPMStructures(f *testing.F) {
	required := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	// The captured seeds pass every check, so the fuzzer starts from
	// acceptance; the Windows AK signs with SHA-1, which is refused.
	seed := func(ak AKParameters, q Quote, binding, nonce []byte, pcrs []PCR, want attest.Reason) {
		k, err := parseAKPublic(ak.Public)
		if err == nil {
			err = k.checkCreation(ak.CreateData, ak.CreateAttestation, ak.CreateSignature)
		}
		if err == nil {
			_, err = verifyQuote(k, q, pcrs, binding, nonce, required, defaultBanks)
		}
		if r, _ := attest.ReasonOf(err); (err == nil) != (want == "") || r != want {
			f.Fatalf("a real seed: got %v, want refusal %q", err, want)
		}
		b, _ := json.Marshal(pcrs)
		f.Add(ak.Public, ak.CreateData, ak.CreateAttestation, ak.CreateSignature, q.Quote, q.Signature, binding, b)
	}
	for _, x := range LoadExchanges(f) {
		seed(x.Request.AK, x.Evidence.Quotes[0], attest.BindingDigest(x.Session.Nonce, x.KubeletKeySHA256), x.Session.Nonce, x.Evidence.PCRs, "")
	}
	wak, wq, wpcrs := windowsAttestation(f)
	seed(wak, wq, []byte{}, nil, wpcrs, attest.ReasonAKAttributes)
	f.Fuzz(func(t *testing.T, akPub, createData, createAtt, createSig, quote, quoteSig, binding, pcrsJSON []byte) {
		ak, err := parseAKPublic(unTPM2B(akPub))
		if err != nil {
			wantReasonIn(t, err, attest.ReasonAKInvalid, attest.ReasonAKAttributes, attest.ReasonMalformed)
			return
		}
		checkAK(t, ak)
		if err := ak.checkCreation(unTPM2B(createData), createAtt, createSig); err != nil {
			wantReasonIn(t, err, attest.ReasonAKCreation, attest.ReasonMalformed)
		} else {
			checkCreationAccepted(t, ak, createData, createAtt)
		}
		if err := ak.computeName(); err != nil {
			wantReasonIn(t, err, attest.ReasonAKInvalid)
			return
		}
		var pcrs []PCR
		_ = json.Unmarshal(pcrsJSON, &pcrs)
		q := Quote{Quote: quote, Signature: quoteSig}
		_, _ = quoteBanks(q)
		qr, err := verifyQuote(ak, q, pcrs, binding, make([]byte, 32), required, defaultBanks)
		if err != nil {
			wantReasonIn(t, err, attest.ReasonQuoteSignature, attest.ReasonMalformed, attest.ReasonQuoteNotTPM,
				attest.ReasonQuoteBinding, attest.ReasonQuoteRawNonce, attest.ReasonQuoteKeyMissing,
				attest.ReasonQuoteSelection, attest.ReasonQuotePCRDigest, attest.ReasonNoSHA256Bank)
			return
		}
		checkQuoteAccepted(t, ak, quote, binding, required, qr)
	})
}

func checkAK(t *testing.T, ak *akKey) {
	t.Helper()
	a := ak.public.Attributes
	const need = tpm2.FlagFixedTPM | tpm2.FlagFixedParent | tpm2.FlagSensitiveDataOrigin | tpm2.FlagRestricted | tpm2.FlagSign
	if a&need != need || a&tpm2.FlagDecrypt != 0 {
		t.Fatalf("accepted an AK with attributes %#x", uint32(a))
	}
	switch k := ak.key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < minRSABits {
			t.Fatalf("accepted an RSA AK of %d bits", k.N.BitLen())
		}
	case *ecdsa.PublicKey:
		if k.Curve.Params().BitSize < minECCBits {
			t.Fatalf("accepted an AK on %s", k.Curve.Params().Name)
		}
	default:
		t.Fatalf("accepted an AK of type %T", ak.key)
	}
	if ak.hash != crypto.SHA256 && ak.hash != crypto.SHA384 && ak.hash != crypto.SHA512 {
		t.Fatalf("accepted an AK signing with %v", ak.hash)
	}
}

func checkCreationAccepted(t *testing.T, ak *akKey, createData, createAtt []byte) {
	t.Helper()
	att, err := tpm2.DecodeAttestationData(createAtt)
	if err != nil || att.Magic != tpmGeneratedValue || att.Type != tpm2.TagAttestCreation || att.AttestedCreationInfo == nil {
		t.Fatalf("accepted a creation attestation that is not one: %v", err)
	}
	if ok, err := att.AttestedCreationInfo.Name.MatchesPublic(ak.public); err != nil || !ok {
		t.Fatal("accepted a creation attestation of another key")
	}
	h, err := ak.public.NameAlg.Hash()
	if err != nil {
		t.Fatal(err)
	}
	d := h.New()
	d.Write(createData)
	if !bytes.Equal(d.Sum(nil), att.AttestedCreationInfo.OpaqueDigest) {
		t.Fatal("accepted creation data the attestation does not digest")
	}
}

func checkQuoteAccepted(t *testing.T, ak *akKey, quote, binding []byte, required []int, qr *quoteResult) {
	t.Helper()
	att, sels, err := decodeQuote(quote, "quote")
	if err != nil || att.Magic != tpm2new.TPMGeneratedValue || att.Type != tpm2new.TPMSTAttestQuote {
		t.Fatalf("accepted a quote that is not one: %v", err)
	}
	if !bytes.Equal(att.ExtraData.Buffer, binding) {
		t.Fatalf("accepted a quote binding %x, want %x", att.ExtraData.Buffer, binding)
	}
	var sel *selection
	for i := range sels {
		if sels[i].bank == qr.bank {
			sel = &sels[i]
		}
	}
	if sel == nil {
		t.Fatalf("accepted bank %v that the quote does not select", qr.bank)
	}
	for _, i := range required {
		if _, ok := qr.pcrs[i]; !ok {
			t.Fatalf("accepted a quote without PCR %d", i)
		}
	}
	for i, v := range qr.pcrs {
		if len(v) != qr.bank.Size() || !slices.Contains(sel.pcrs, i) {
			t.Fatalf("PCR %d value of %d bytes in bank %v (selected %v)", i, len(v), qr.bank, sel.pcrs)
		}
	}
	if len(qr.pcrs) != len(uniqueInts(sel.pcrs)) {
		t.Fatalf("%d PCR values for %d selected PCRs", len(qr.pcrs), len(sel.pcrs))
	}
	if len(sels) == 1 {
		info, _ := att.Attested.Quote()
		h := ak.hash.New()
		for _, i := range sel.pcrs {
			h.Write(qr.pcrs[i])
		}
		if !bytes.Equal(h.Sum(nil), info.PCRDigest.Buffer) {
			t.Fatal("accepted PCR values the quote does not digest")
		}
	}
}

func uniqueInts(s []int) []int {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// FuzzTPMVerify answers a real sealed session (captured from swtpm and the
// simulator) with a fuzzed second message: activation secret, quote,
// signature, PCR values (JSON), event log and the kubelet key hash.
// Seeds are the real answers, which verify. Properties: refusals are
// Denials; accepted evidence activated the session's secret, binds the
// session's nonce and kubelet key in a quote, and the claims carry the
// session's EK, the values the quote covers and only PCRs quoted.
func FuzzTPMVerify(f *testing.F) {
	xs := LoadExchanges(f)
	verifiers := make([]*Verifier, len(xs))
	for i := range xs {
		x := &xs[i]
		verifiers[i] = x.Verifier(f)
		ev := x.Evidence
		sess := x.Session
		if _, err := verifiers[i].Verify(&sess, &ev); err != nil {
			f.Fatalf("the %s seed is refused: %v", x.Producer, err)
		}
		pcrs, _ := json.Marshal(ev.PCRs)
		q := ev.Quotes[0]
		f.Add(uint8(i), ev.ActivationSecret, q.Quote, q.Signature, pcrs, ev.EventLog, ev.KubeletKeySHA256)
		f.Add(uint8(i), ev.ActivationSecret, q.Quote, q.Signature, pcrs, ev.EventLog[:len(ev.EventLog)/2], ev.KubeletKeySHA256)
		f.Add(uint8(i), ev.ActivationSecret, q.Quote, q.Signature, pcrs, []byte(nil), ev.KubeletKeySHA256)
	}
	f.Fuzz(func(t *testing.T, which uint8, secret, quote, sig, pcrsJSON, log, keySHA []byte) {
		i := int(which) % len(xs)
		x := &xs[i]
		var pcrs []PCR
		_ = json.Unmarshal(pcrsJSON, &pcrs)
		sess := x.Session
		ev := &Evidence{KubeletKeySHA256: keySHA, ActivationSecret: secret, Quotes: []Quote{{Quote: quote, Signature: sig}}, PCRs: pcrs, EventLog: log}
		claims, err := verifiers[i].Verify(&sess, ev)
		if err != nil {
			if claims != nil {
				t.Fatal("claims with a refusal")
			}
			if _, ok := attest.ReasonOf(err); !ok {
				t.Fatalf("untyped refusal: %v", err)
			}
			return
		}
		var st sessionState
		if err := json.Unmarshal(x.Session.State, &st); err != nil {
			t.Fatal(err)
		}
		att, err := tpm2.DecodeAttestationData(quote)
		switch {
		case !bytes.Equal(secret, st.Secret):
			t.Fatal("accepted without the activation secret")
		case !bytes.Equal(keySHA, x.Session.KubeletKeySHA256) || !bytes.Equal(claims.KubeletKeySHA256, x.Session.KubeletKeySHA256):
			t.Fatal("accepted another kubelet key")
		case err != nil || !bytes.Equal(att.ExtraData, attest.BindingDigest(x.Session.Nonce, x.Session.KubeletKeySHA256)):
			t.Fatal("accepted a quote that does not bind the session")
		case claims.Identity != "tpm-ek:"+hex.EncodeToString(st.EKSHA256) || claims.TPM.EKTrust != st.EKTrust:
			t.Fatalf("claims name EK %q (%s)", claims.Identity, claims.TPM.EKTrust)
		}
		quoted := map[int]bool{}
		for _, p := range att.AttestedQuoteInfo.PCRSelection.PCRs {
			quoted[p] = true
		}
		for k, v := range claims.TPM.PCRs {
			if !quoted[k] {
				t.Fatalf("claims carry PCR %d, not quoted", k)
			}
			found := false
			for _, p := range pcrs {
				if p.Index == k && p.Bank == claims.TPM.PCRBank && hex.EncodeToString(p.Digest) == v {
					found = true
				}
			}
			if !found {
				t.Fatalf("claimed PCR %d = %s was not sent", k, v)
			}
		}
		for _, p := range claims.TPM.Boot.ReplayedPCRs {
			if !quoted[p] {
				t.Fatalf("boot state read from PCR %d, not quoted", p)
			}
		}
	})
}
