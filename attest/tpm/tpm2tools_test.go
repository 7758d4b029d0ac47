package tpm_test

// A second, independent producer of TPM evidence: tpm2-tools (the CLI)
// against a swtpm make the attestation key, activate the server's
// credential and quote the PCRs; the test converts the tools' files into
// the wire format (wire.go) and checks that the Verifier accepts them and
// refuses each tampered variant with its own reason. Nothing here goes
// through go-attestation, so a wire-format field that only go-attestation
// happens to fill the way verify.go expects shows up as a failure.

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// The tpm2-tools binaries this test runs.
var tpm2ToolsBinaries = []string{
	"tpm2_nvread", "tpm2_readpublic", "tpm2_createprimary", "tpm2_create", "tpm2_load",
	"tpm2_certifycreation", "tpm2_startauthsession", "tpm2_policysecret",
	"tpm2_activatecredential", "tpm2_quote", "tpm2_flushcontext",
}

// Where swtpm_setup (swtpm.Manufacturer.Provision) leaves the RSA EK and
// its certificate (TCG EK Credential Profile handles).
const (
	toolsEKHandle        = "0x81010001"
	toolsEKCertNV        = "0x01C00002"
	toolsQuotedPCRs      = "sha256:0,1,2,3,4,5,6,7,8,9"
	toolsTimeout         = 30 * time.Second
	toolsMakeCredMagic   = 0xBADCC0DE // tpm2_makecredential's output header
	toolsMakeCredVersion = 1
	toolsPCRCount        = 10
	toolsSHA256Length    = 32
)

// tpm2Tools runs tpm2-tools against one swtpm, in one working directory.
type tpm2Tools struct {
	t    *testing.T
	dir  string
	tcti string
}

// newTPM2Tools provisions and starts a swtpm whose PCRs hold log, and
// returns a runner for tpm2-tools talking to it.
func newTPM2Tools(t *testing.T, log []byte) *tpm2Tools {
	t.Helper()
	for _, bin := range tpm2ToolsBinaries {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found (%v); install tpm2-tools with: apt-get install -y tpm2-tools", bin, err)
		}
	}
	state := filepath.Join(t.TempDir(), "tpm")
	if err := manufacturer(t).Provision(context.Background(), state); err != nil {
		t.Fatal(err)
	}
	p, err := swtpm.Start(context.Background(), state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	// swtpm serves one client at a time: extend the firmware log over our
	// own connection first, and close it before any tool connects.
	ch, err := tpm.DialSocket("tcp", p.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tpmtest.ExtendLog(ch, log); err != nil {
		t.Fatalf("extend log into swtpm: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	// The swtpm TCTI needs the control channel on the next port, which is
	// where swtpm.Start serves it.
	return &tpm2Tools{t: t, dir: t.TempDir(), tcti: "swtpm:host=127.0.0.1,port=" + strconv.Itoa(p.Port)}
}

// run runs one tool in the working directory with a timeout and returns
// its standard output; a failure shows the tool's whole output. Without a
// resource manager every context a tool loads stays in the TPM (swtpm has
// three transient slots), so transient objects are flushed after each
// tool.
func (x *tpm2Tools) run(tool string, args ...string) []byte {
	x.t.Helper()
	out := x.exec(tool, args...)
	if tool != "tpm2_flushcontext" {
		x.exec("tpm2_flushcontext", "-t")
	}
	return out
}

func (x *tpm2Tools) exec(tool string, args ...string) []byte {
	x.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), toolsTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, append([]string{"-T", x.tcti}, args...)...)
	cmd.Dir = x.dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		x.t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", tool, strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes()
}

func (x *tpm2Tools) read(name string) []byte {
	x.t.Helper()
	b, err := os.ReadFile(filepath.Join(x.dir, name))
	if err != nil {
		x.t.Fatal(err)
	}
	return b
}

func (x *tpm2Tools) write(name string, b []byte) {
	x.t.Helper()
	if err := os.WriteFile(filepath.Join(x.dir, name), b, 0o600); err != nil {
		x.t.Fatal(err)
	}
}

// tpm2bBody returns the contents of a TPM2B structure: tpm2-tools writes
// -u (TPM2B_PUBLIC) and --creation-data (TPM2B_CREATION_DATA) with their
// 2-byte big-endian size; the wire format carries the bare structure.
func tpm2bBody(t *testing.T, what string, b []byte) []byte {
	t.Helper()
	if len(b) < 2 || int(binary.BigEndian.Uint16(b)) != len(b)-2 {
		t.Fatalf("%s is not a TPM2B (%d bytes, %x...)", what, len(b), b[:min(len(b), 4)])
	}
	return b[2:]
}

// challengeRequest reads the EK and its certificate, makes an AK with
// creation data as go-attestation does (ECDSA P-256 restricted signing key
// under a storage primary; certify its own creation) and returns the
// first message.
func (x *tpm2Tools) challengeRequest() *tpm.ChallengeRequest {
	t := x.t
	t.Helper()
	// EK certificate: the NV index content as is (DER here; the verifier
	// also accepts the TCG NV header).
	x.run("tpm2_nvread", toolsEKCertNV, "-C", toolsEKCertNV, "-o", "ekcert.der")
	// EK public: -f der writes a SubjectPublicKeyInfo (OpenSSL's
	// i2d_PUBKEY). Check it parses and is what Go encodes for the same key,
	// so the EK identity hash is the one any producer gets.
	x.run("tpm2_readpublic", "-c", toolsEKHandle, "-f", "der", "-o", "ek.der")
	ekDER := x.read("ek.der")
	ekKey, err := x509.ParsePKIXPublicKey(ekDER)
	if err != nil {
		t.Fatalf("tpm2_readpublic -f der is not PKIX DER: %v", err)
	}
	if goDER, err := x509.MarshalPKIXPublicKey(ekKey); err != nil || !bytes.Equal(goDER, ekDER) {
		t.Fatalf("tpm2_readpublic's DER differs from Go's encoding of the same key (%v)", err)
	}

	// AK: attributes of go-attestation's ECC template (FlagSignerDefault |
	// FlagNoDA), no symmetric scheme (":null"; a restricted signing key
	// refuses one), ECDSA-SHA256, no creation PCRs.
	x.run("tpm2_createprimary", "-C", "o", "-G", "ecc256", "-c", "srk.ctx")
	x.run("tpm2_create", "-C", "srk.ctx", "-G", "ecc256:ecdsa-sha256:null",
		"-a", "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|noda|restricted|sign",
		"-u", "ak.pub", "-r", "ak.priv",
		"--creation-data", "ak.creation", "--creation-ticket", "ak.ticket", "--creation-hash", "ak.creationhash")
	x.run("tpm2_load", "-C", "srk.ctx", "-u", "ak.pub", "-r", "ak.priv", "-c", "ak.ctx")
	// TPM2_CertifyCreation signed by the AK over its own creation.
	// --attestation is the bare TPMS_ATTEST (starts with TPM_GENERATED);
	// -o in the default "tss" format is a TPMT_SIGNATURE (sigAlg, hash,
	// then the scheme's fields; for ECDSA two TPM2B parameters R and S).
	x.run("tpm2_certifycreation", "-C", "ak.ctx", "-c", "ak.ctx", "-d", "ak.creationhash", "-t", "ak.ticket",
		"-g", "sha256", "-o", "ak.certify.sig", "--attestation", "ak.certify.attest")

	return &tpm.ChallengeRequest{
		EKPublic:      ekDER,
		EKCertificate: x.read("ekcert.der"),
		AK: tpm.AKParameters{
			Public:            tpm2bBody(t, "tpm2_create -u", x.read("ak.pub")),
			CreateData:        tpm2bBody(t, "tpm2_create --creation-data", x.read("ak.creation")),
			CreateAttestation: x.read("ak.certify.attest"),
			CreateSignature:   x.read("ak.certify.sig"),
		},
	}
}

// activate runs TPM2_ActivateCredential on the server's challenge and
// returns the secret.
func (x *tpm2Tools) activate(ch *tpm.Challenge) []byte {
	x.t.Helper()
	// tpm2_activatecredential -i reads tpm2_makecredential's file: magic
	// 0xBADCC0DE and version 1 (4 bytes each, big-endian), then the
	// TPM2B_ID_OBJECT and the TPM2B_ENCRYPTED_SECRET with their sizes,
	// which is exactly how go-tpm's credactivation.Generate returns
	// Credential and Secret.
	in := binary.BigEndian.AppendUint32(nil, toolsMakeCredMagic)
	in = binary.BigEndian.AppendUint32(in, toolsMakeCredVersion)
	in = append(in, ch.Credential...)
	in = append(in, ch.Secret...)
	x.write("cred.in", in)
	// The EK's policy is PolicySecret(endorsement hierarchy).
	x.run("tpm2_startauthsession", "--policy-session", "-S", "ek.session")
	x.run("tpm2_policysecret", "-S", "ek.session", "-c", "e")
	x.run("tpm2_activatecredential", "-c", "ak.ctx", "-C", toolsEKHandle, "-i", "cred.in", "-o", "cred.secret",
		"-P", "session:ek.session")
	// The session stays saved in the TPM; flush it.
	x.run("tpm2_flushcontext", "ek.session")
	// -o is the bare certinfo (the TPM2B_DIGEST's buffer).
	return x.read("cred.secret")
}

// answer quotes PCRs 0-9 of the SHA-256 bank over the binding and returns
// the second message.
func (x *tpm2Tools) answer(nonce, keySHA, secret, log []byte) *tpm.Evidence {
	t := x.t
	t.Helper()
	binding := attest.BindingDigest(nonce, keySHA)
	// -m is the bare TPMS_ATTEST, -s in the default "tss" format a
	// TPMT_SIGNATURE, and -o with -F values the selected PCR values
	// concatenated in selection order (PCR 0 first).
	x.run("tpm2_quote", "-c", "ak.ctx", "-l", toolsQuotedPCRs, "-q", hex.EncodeToString(binding),
		"-m", "quote.msg", "-s", "quote.sig", "-o", "quote.pcrs", "-F", "values", "-g", "sha256")
	values := x.read("quote.pcrs")
	if len(values) != toolsPCRCount*toolsSHA256Length {
		t.Fatalf("tpm2_quote -o wrote %d bytes of PCR values; want %d", len(values), toolsPCRCount*toolsSHA256Length)
	}
	ev := &tpm.Evidence{
		KubeletKeySHA256: keySHA,
		ActivationSecret: secret,
		Quotes:           []tpm.Quote{{Quote: x.read("quote.msg"), Signature: x.read("quote.sig")}},
		EventLog:         log,
	}
	for i := 0; i < toolsPCRCount; i++ {
		ev.PCRs = append(ev.PCRs, tpm.PCR{Index: i, Bank: "sha256", Digest: values[i*toolsSHA256Length : (i+1)*toolsSHA256Length]})
	}
	return ev
}

// toolsRun is one honest run of the protocol with tpm2-tools as the node.
type toolsRun struct {
	tools  *tpm2Tools
	v      *tpm.Verifier
	keySHA []byte
	log    []byte
	req    *tpm.ChallengeRequest
	sess   *attest.Session
	ev     *tpm.Evidence
}

func runTPM2Tools(t *testing.T) *toolsRun {
	t.Helper()
	r := &toolsRun{log: firmwaretestdata.MustLog("rhel8-uefi")}
	r.tools = newTPM2Tools(t, r.log)
	// The manufacturer's CA exists once a TPM was provisioned.
	r.v = swtpmVerifier(t, nil)
	_, _, r.keySHA = newKubeletKey(t)
	r.req = r.tools.challengeRequest()
	ch, sess, err := r.v.Challenge("worker", r.keySHA, r.req)
	if err != nil {
		t.Fatalf("challenge for tpm2-tools' AK refused: %v", err)
	}
	r.sess = sess
	r.ev = r.tools.answer(ch.Nonce, r.keySHA, r.tools.activate(ch), r.log)
	return r
}

func TestTPM2ToolsEvidenceAccepted(t *testing.T) {
	r := runTPM2Tools(t)
	claims, err := r.v.Verify(r.sess, r.ev)
	if err != nil {
		t.Fatalf("evidence made by tpm2-tools refused: %v", err)
	}
	c := claims.TPM
	if c.EKTrust != "ca:swtpm-localca" {
		t.Errorf("EK trust = %q, want ca:swtpm-localca", c.EKTrust)
	}
	if c.PCRBank != "sha256" || len(c.PCRs) != toolsPCRCount {
		t.Errorf("bank %q with %d PCRs; want sha256 and %d", c.PCRBank, len(c.PCRs), toolsPCRCount)
	}
	if !c.Boot.SecureBootKnown || !c.Boot.SecureBoot {
		t.Errorf("secure boot = known %v on %v, want known and on", c.Boot.SecureBootKnown, c.Boot.SecureBoot)
	}
	if !bytes.Equal(claims.KubeletKeySHA256, r.keySHA) {
		t.Error("claims bind another kubelet key")
	}
}

// toolsInput is what one tampered run sends: both messages and the session.
type toolsInput struct {
	req  tpm.ChallengeRequest
	ev   *tpm.Evidence
	sess *attest.Session
}

// clone deep-copies the honest input so a case edits its own copy.
func (r *toolsRun) clone() *toolsInput {
	in := &toolsInput{req: *r.req, sess: r.sess}
	in.req.EKPublic = bytes.Clone(r.req.EKPublic)
	in.req.EKCertificate = bytes.Clone(r.req.EKCertificate)
	in.req.AK = tpm.AKParameters{
		Public:            bytes.Clone(r.req.AK.Public),
		CreateData:        bytes.Clone(r.req.AK.CreateData),
		CreateAttestation: bytes.Clone(r.req.AK.CreateAttestation),
		CreateSignature:   bytes.Clone(r.req.AK.CreateSignature),
	}
	ev := *r.ev
	ev.ActivationSecret = bytes.Clone(r.ev.ActivationSecret)
	ev.EventLog = bytes.Clone(r.ev.EventLog)
	ev.Quotes = nil
	for _, q := range r.ev.Quotes {
		ev.Quotes = append(ev.Quotes, tpm.Quote{Quote: bytes.Clone(q.Quote), Signature: bytes.Clone(q.Signature)})
	}
	ev.PCRs = nil
	for _, p := range r.ev.PCRs {
		ev.PCRs = append(ev.PCRs, tpm.PCR{Index: p.Index, Bank: p.Bank, Digest: bytes.Clone(p.Digest)})
	}
	in.ev = &ev
	return in
}

// logDigestOffset returns the offset in log of the SHA-256 digest of its
// first EFI boot application event (PCR 4), which occurs exactly once.
func logDigestOffset(t *testing.T, log []byte) int {
	t.Helper()
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range el.Events(register.HashSHA256) {
		if e.Index == 4 && e.Type == tcg.EFIBootServicesApplication {
			if n := bytes.Count(log, e.Digest); n != 1 {
				t.Fatalf("boot application digest occurs %d times in the log", n)
			}
			return bytes.Index(log, e.Digest)
		}
	}
	t.Fatal("no EFI boot application event in PCR 4")
	return 0
}

func TestTPM2ToolsTamperedEvidence(t *testing.T) {
	r := runTPM2Tools(t)
	// A second session for the same TPM, whose credential the TPM really
	// activates: the honest quote replayed into it must still fail.
	ch2, sess2, err := r.v.Challenge("worker", r.keySHA, r.req)
	if err != nil {
		t.Fatal(err)
	}
	secret2 := r.tools.activate(ch2)
	logOff := logDigestOffset(t, r.log)

	cases := []struct {
		name   string
		tamper func(in *toolsInput)
		want   attest.Reason
	}{
		{"quote signature byte flipped", func(in *toolsInput) {
			s := in.ev.Quotes[0].Signature
			s[len(s)-1] ^= 0x01 // last byte of the ECDSA S value
		}, attest.ReasonQuoteSignature},
		{"PCR value changed", func(in *toolsInput) {
			in.ev.PCRs[7].Digest[0] ^= 0x01
		}, attest.ReasonQuotePCRDigest},
		{"event digest in the log changed", func(in *toolsInput) {
			in.ev.EventLog[logOff] ^= 0x01
		}, attest.ReasonEventLogReplay},
		{"wrong activation secret", func(in *toolsInput) {
			in.ev.ActivationSecret[0] ^= 0x01
		}, attest.ReasonActivation},
		// The secret is checked before the quote: evidence sent to another
		// session as it is fails at the activation secret.
		{"another session, this session's secret", func(in *toolsInput) {
			in.sess = sess2
		}, attest.ReasonActivation},
		// With the other session's secret really activated, the quote's
		// qualifying data (the first nonce) is what gives it away.
		{"quote replayed into another session", func(in *toolsInput) {
			in.sess = sess2
			in.ev.ActivationSecret = bytes.Clone(secret2)
		}, attest.ReasonQuoteBinding},
		{"AK creation signature flipped", func(in *toolsInput) {
			s := in.req.AK.CreateSignature
			s[len(s)-1] ^= 0x01
		}, attest.ReasonAKCreation},
		// Attributes are checked (parseAKPublic) before the creation
		// attestation, which would also fail: it names the real AK.
		{"AK restricted attribute cleared", func(in *toolsInput) {
			// TPMT_PUBLIC: type (2 bytes), nameAlg (2), objectAttributes (4).
			attrs := binary.BigEndian.Uint32(in.req.AK.Public[4:8])
			binary.BigEndian.PutUint32(in.req.AK.Public[4:8], attrs&^(1<<16)) // TPMA_OBJECT restricted
		}, attest.ReasonAKAttributes},
	}
	// attempt runs the whole protocol on an input: the challenge (which
	// refuses a bad request), then the answer against the session.
	attempt := func(in *toolsInput) error {
		if _, _, err := r.v.Challenge("worker", r.keySHA, &in.req); err != nil {
			return err
		}
		_, err := r.v.Verify(in.sess, in.ev)
		return err
	}
	if err := attempt(r.clone()); err != nil {
		t.Fatalf("untampered copy refused: %v", err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := r.clone()
			tc.tamper(in)
			wantReason(t, attempt(in), tc.want)
		})
	}
}

// quoteWith quotes PCRs 0-9 of the SHA-256 bank with qualifying data
// qual and returns the evidence around it.
func (x *tpm2Tools) quoteWith(qual, keySHA, secret, log []byte) *tpm.Evidence {
	x.t.Helper()
	x.run("tpm2_quote", "-c", "ak.ctx", "-l", toolsQuotedPCRs, "-q", hex.EncodeToString(qual),
		"-m", "q.msg", "-s", "q.sig", "-o", "q.pcrs", "-F", "values", "-g", "sha256")
	values := x.read("q.pcrs")
	ev := &tpm.Evidence{KubeletKeySHA256: keySHA, ActivationSecret: secret, EventLog: log,
		Quotes: []tpm.Quote{{Quote: x.read("q.msg"), Signature: x.read("q.sig")}}}
	for i := 0; i < toolsPCRCount; i++ {
		ev.PCRs = append(ev.PCRs, tpm.PCR{Index: i, Bank: "sha256", Digest: values[i*toolsSHA256Length : (i+1)*toolsSHA256Length]})
	}
	return ev
}

// TestTPM2ToolsBindingAttacks: the mistakes an integrator makes with the
// quote's qualifying data, each named by its own reason, so the refusal
// says what to fix; and the creation data sent in part.
func TestTPM2ToolsBindingAttacks(t *testing.T) {
	r := runTPM2Tools(t)
	ch, sess, err := r.v.Challenge("worker", r.keySHA, r.req)
	if err != nil {
		t.Fatal(err)
	}
	secret := r.tools.activate(ch)
	other := make([]byte, 32)
	for _, tc := range []struct {
		name string
		qual []byte
		want attest.Reason
	}{
		{"the raw nonce as qualifying data", ch.Nonce, attest.ReasonQuoteRawNonce},
		{"the binding without the kubelet key hash", attest.BindingDigest(ch.Nonce, nil), attest.ReasonQuoteKeyMissing},
		{"another session's nonce", attest.BindingDigest(other, r.keySHA), attest.ReasonQuoteBinding},
	} {
		_, err := r.v.Verify(sess, r.tools.quoteWith(tc.qual, r.keySHA, secret, r.log))
		got, _ := attest.ReasonOf(err)
		attacktable.Check(t, "TPM interop", "tpm2-tools: "+tc.name, string(tc.want), string(got))
	}
	if _, err := r.v.Verify(sess, r.tools.quoteWith(attest.BindingDigest(ch.Nonce, r.keySHA), r.keySHA, secret, r.log)); err != nil {
		t.Fatalf("the right binding refused: %v", err)
	}
	partial := *r.req
	partial.AK.CreateAttestation = nil
	_, _, err = r.v.Challenge("worker", r.keySHA, &partial)
	got, _ := attest.ReasonOf(err)
	attacktable.Check(t, "TPM interop", "creation data without its attestation", string(attest.ReasonMalformed), string(got))
}
