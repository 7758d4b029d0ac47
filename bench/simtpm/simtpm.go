// Package simtpm is a pure-Go model of the TPM 2.0 operations nodeproof's
// node side performs, for the scale benchmark: a thousand machines in one
// process instead of a thousand swtpm processes.
//
// A Machine has what a provisioned, booted machine's TPM has, and produces
// the TPM structures a real TPM (driven by go-attestation, as
// attest/tpm.Collector drives it) produces, marshalled with go-tpm, so the
// real server side (attest/tpm.Verifier, attest/policy) accepts them
// unchanged:
//
//   - an RSA-2048 EK whose TPMT_PUBLIC is the TCG default EK template
//     (the Name a real TPM's EK would have), and an EK certificate for it
//     issued by an internal/tpmtest.VendorCA;
//   - an SRK (go-attestation's ECC P-256 storage key at 0x81000002, as
//     attest/tpm.Collector asks for it, which go-attestation creates as a
//     primary of the endorsement hierarchy), present only as the AK's parent: its Name and Qualified
//     Name appear in the AK's creation data and qualified signer;
//   - SHA-1 and SHA-256 PCR banks extended from a TCG event log exactly as
//     internal/tpmtest.ExtendLog extends a freshly started TPM (PCRs 0-16
//     from zero, 17-22 at their all-ones startup value, 23 zero);
//   - an ECDSA P-256 AK made with go-attestation's AK template
//     (signer-default attributes plus noDA, ECDSA/SHA-256), its
//     TPMS_CREATION_DATA, the TPM2_CertifyCreation TPMS_ATTEST and its
//     TPMT_SIGNATURE;
//   - TPM2_ActivateCredential (TPM 2.0 Part 1, 24.4-24.5: RSA-OAEP of the
//     seed under the EK with label "IDENTITY", KDFa "STORAGE" and
//     "INTEGRITY" keys bound to the AK's Name, the outer HMAC, AES-128-CFB)
//     and TPM2_Quote of PCRs 0-23 of the SHA-256 bank, with clock info and
//     firmware version (in the clear: the AK is in the endorsement
//     hierarchy, whose attestations a TPM does not obfuscate).
//
// Machine.Request and Machine.Answer have attest/tpm.Collector's semantics;
// *Machine satisfies agent.TPM.
//
// RSA key generation dominates the cost of a machine (tens of
// milliseconds per key; Go 1.26 ignores custom randomness in key
// generation, so keys cannot be derived from a seed). EKKeys keeps
// pre-generated EK keys in a file cache under $NODEPROOF_CACHE (default
// ~/.cache/nodeproof), generates only the missing ones, in parallel, and
// WithEKKey hands one to NewMachine. Every machine still gets its own EK key
// (as long as each key is used once), its own EK certificate (issued anew
// by the run's vendor CA) and its own AK.
package simtpm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	cryptorand "crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// FirmwareVersion is the TPM firmware version the model reports,
// libtpms 0.9's TPM_PT_FIRMWARE_VERSION_1 and _2 (what swtpm reports).
const FirmwareVersion uint64 = 0x20191023_00163636

// Option configures NewMachine.
type Option func(*config)

type config struct {
	ekKey *rsa.PrivateKey
	now   time.Time
	banks *pcrBanks
}

// WithEKKey makes key the machine's EK instead of generating one. Each key
// must be used by one machine only (EKKeys hands out distinct keys).
func WithEKKey(key *rsa.PrivateKey) Option { return func(c *config) { c.ekKey = key } }

// WithTime issues the EK certificate at t (valid from an hour before; see
// tpmtest.VendorCA.IssueEK) instead of now: for verifiers on a fixed clock.
func WithTime(t time.Time) Option { return func(c *config) { c.now = t } }

// Machine is one modelled TPM. Its methods are safe for concurrent use.
type Machine struct {
	ek       *rsa.PrivateKey
	ekPublic []byte // TPMT_PUBLIC
	ekPKIX   []byte
	ekCert   []byte

	srkPublic []byte // TPMT_PUBLIC
	srkQN     []byte // TPM2B_NAME contents

	ak       *ecdsa.PrivateKey
	akPublic []byte
	akName   []byte // TPM2B_NAME contents: nameAlg || digest
	akQN     []byte

	createData, createAttestation, createSignature []byte

	banks *pcrBanks
	log   []byte

	// Clock info: the TPM's powered time when the model was made, and
	// its boot count.
	clockBase  uint64
	born       time.Time
	resetCount uint32
}

// NewMachine makes a machine whose TPM has its own EK (certified by
// vendor), SRK and AK, and whose PCRs hold log (a TCG event log, e.g.
// firmwaretestdata.MustLog("rhel8-uefi"); nil or empty: a machine without
// measured boot). rand is the model's own randomness (SRK unique, proof
// values, clock; nil: crypto/rand); keys and signatures always use
// crypto/rand, as Go ignores other readers there.
func NewMachine(vendor *tpmtest.VendorCA, log []byte, rand io.Reader, opts ...Option) (*Machine, error) {
	if vendor == nil {
		return nil, errors.New("simtpm: a vendor CA is required to certify the EK")
	}
	if rand == nil {
		rand = cryptorand.Reader
	}
	cfg := config{}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.now.IsZero() {
		cfg.now = time.Now()
	}
	m := &Machine{log: log, born: time.Now(), banks: cfg.banks}
	if m.banks == nil {
		var err error
		if m.banks, err = replayLog(log); err != nil {
			return nil, err
		}
	}

	// Endorsement key and its certificate.
	m.ek = cfg.ekKey
	if m.ek == nil {
		var err error
		if m.ek, err = rsa.GenerateKey(cryptorand.Reader, 2048); err != nil {
			return nil, fmt.Errorf("simtpm: EK: %w", err)
		}
	}
	if m.ek.N.BitLen() != 2048 || m.ek.E != 65537 {
		return nil, errors.New("simtpm: the EK must be RSA-2048 with exponent 65537 (the TCG default EK template)")
	}
	ekPub := ekTemplate(m.ek.N.FillBytes(make([]byte, 256)))
	m.ekPublic = tpm2.Marshal(ekPub)
	var err error
	if m.ekPKIX, err = x509.MarshalPKIXPublicKey(&m.ek.PublicKey); err != nil {
		return nil, fmt.Errorf("simtpm: EK: %w", err)
	}
	if m.ekCert, err = vendor.IssueEK(&m.ek.PublicKey, cfg.now); err != nil {
		return nil, fmt.Errorf("simtpm: EK certificate: %w", err)
	}

	// The SRK: only its names are ever seen. Its unique field is random
	// (a real SRK's is a point derived from the endorsement seed).
	srkUnique := make([]byte, 64)
	if _, err := io.ReadFull(rand, srkUnique); err != nil {
		return nil, fmt.Errorf("simtpm: SRK: %w", err)
	}
	srk := srkTemplate(srkUnique[:32], srkUnique[32:])
	m.srkPublic = tpm2.Marshal(srk)
	srkName, err := objectName(srk)
	if err != nil {
		return nil, err
	}
	m.srkQN = qualifiedName(tpm2.HandleName(tpm2.TPMRHEndorsement).Buffer, srkName)

	// The clock: up to 30 days of powered time, up to 1,000 boots.
	var seed [8 + 4]byte
	if _, err := io.ReadFull(rand, seed[:]); err != nil {
		return nil, fmt.Errorf("simtpm: %w", err)
	}
	m.clockBase = binary.BigEndian.Uint64(seed[:8]) % (30 * 24 * 3600 * 1000)
	m.resetCount = 1 + binary.BigEndian.Uint32(seed[8:12])%1000

	// The AK: TPM2_Create under the SRK, then TPM2_CertifyCreation.
	if m.ak, err = ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader); err != nil {
		return nil, fmt.Errorf("simtpm: AK: %w", err)
	}
	ecdhKey, err := m.ak.PublicKey.ECDH()
	if err != nil {
		return nil, fmt.Errorf("simtpm: AK: %w", err)
	}
	point := ecdhKey.Bytes() // 0x04 || X || Y, each 32 bytes
	akPub := akTemplate(point[1:33], point[33:65])
	m.akPublic = tpm2.Marshal(akPub)
	if m.akName, err = objectName(akPub); err != nil {
		return nil, err
	}
	m.akQN = qualifiedName(m.srkQN, m.akName)

	m.createData = tpm2.Marshal(creationData(srkName, m.srkQN))
	creationHash := sha256.Sum256(m.createData)
	m.createAttestation = tpm2.Marshal(m.attest(tpm2.TPMSTAttestCreation, nil,
		tpm2.NewTPMUAttest(tpm2.TPMSTAttestCreation, &tpm2.TPMSCreationInfo{
			ObjectName:   tpm2.TPM2BName{Buffer: m.akName},
			CreationHash: tpm2.TPM2BDigest{Buffer: creationHash[:]},
		})))
	r, s, err := m.sign(m.createAttestation)
	if err != nil {
		return nil, err
	}
	// go-attestation keeps CertifyCreation's signature as the TPM sent it.
	m.createSignature = tpm2.Marshal(tpmSignature(r, s))
	return m, nil
}

// attest builds a TPMS_ATTEST signed by the AK.
func (m *Machine) attest(typ tpm2.TPMST, extraData []byte, attested tpm2.TPMUAttest) tpm2.TPMSAttest {
	return tpm2.TPMSAttest{
		Magic:           tpm2.TPMGeneratedValue,
		Type:            typ,
		QualifiedSigner: tpm2.TPM2BName{Buffer: m.akQN},
		ExtraData:       tpm2.TPM2BData{Buffer: extraData},
		ClockInfo: tpm2.TPMSClockInfo{
			Clock:        m.clockBase + uint64(time.Since(m.born).Milliseconds()),
			ResetCount:   m.resetCount,
			RestartCount: 0, // no TPM2_Shutdown(STATE) since boot
			Safe:         true,
		},
		FirmwareVersion: FirmwareVersion,
		Attested:        attested,
	}
}

// sign is the AK's ECDSA/SHA-256 signature over msg.
func (m *Machine) sign(msg []byte) (r, s []byte, err error) {
	d := sha256.Sum256(msg)
	sig, err := ecdsa.SignASN1(cryptorand.Reader, m.ak, d[:])
	if err != nil {
		return nil, nil, fmt.Errorf("simtpm: sign: %w", err)
	}
	return parseASN1Signature(sig)
}

// Request returns the first message, as attest/tpm.Collector.Request does:
// the EK (PKIX), its certificate (DER, as read from NV) and the AK's
// parameters.
func (m *Machine) Request() (*tpm.ChallengeRequest, error) {
	return &tpm.ChallengeRequest{
		EKPublic:      bytes.Clone(m.ekPKIX),
		EKCertificate: bytes.Clone(m.ekCert),
		AK: tpm.AKParameters{
			Public:            bytes.Clone(m.akPublic),
			CreateData:        bytes.Clone(m.createData),
			CreateAttestation: bytes.Clone(m.createAttestation),
			CreateSignature:   bytes.Clone(m.createSignature),
		},
	}, nil
}

// Answer activates the challenge's credential (none when the challenge
// carries none: the server took the AK's ticket) and quotes PCRs 0-23 of
// the SHA-256 bank with qualifying data attest.BindingDigest(challenge
// nonce, kubeletKeySHA256), as attest/tpm.Collector.Answer does. A
// credential made for another EK or AK fails here, as it fails in a TPM.
func (m *Machine) Answer(ch *tpm.Challenge, kubeletKeySHA256 []byte) (*tpm.Evidence, error) {
	if ch == nil {
		return nil, errors.New("simtpm: no challenge")
	}
	binding := attest.BindingDigest(ch.Nonce, kubeletKeySHA256)
	var secret []byte
	if len(ch.Credential) > 0 || len(ch.Secret) > 0 {
		var err error
		if secret, err = m.ActivateCredential(ch.Credential, ch.Secret); err != nil {
			return nil, fmt.Errorf("activate credential: %w", err)
		}
	}
	q, err := m.Quote(binding)
	if err != nil {
		return nil, fmt.Errorf("quote: %w", err)
	}
	ev := &tpm.Evidence{
		KubeletKeySHA256: kubeletKeySHA256,
		ActivationSecret: secret,
		Quotes:           []tpm.Quote{q},
		PCRs:             make([]tpm.PCR, 0, numPCRs),
		EventLog:         m.log,
	}
	for i, d := range m.banks.sha256 {
		ev.PCRs = append(ev.PCRs, tpm.PCR{Index: i, Bank: "sha256", Digest: bytes.Clone(d)})
	}
	return ev, nil
}

// Quote is TPM2_Quote by the AK of PCRs 0-23 of the SHA-256 bank with
// qualifying data extraData, as go-attestation's AK.Quote returns it.
func (m *Machine) Quote(extraData []byte) (tpm.Quote, error) {
	if len(extraData) > maxData {
		return tpm.Quote{}, errors.New("TPM_RC_SIZE: qualifying data too large")
	}
	h := sha256.New()
	for _, d := range m.banks.sha256 {
		h.Write(d)
	}
	quoted := tpm2.Marshal(m.attest(tpm2.TPMSTAttestQuote, extraData,
		tpm2.NewTPMUAttest(tpm2.TPMSTAttestQuote, &tpm2.TPMSQuoteInfo{
			PCRSelect: pcrSelection(tpm2.TPMAlgSHA256),
			PCRDigest: tpm2.TPM2BDigest{Buffer: h.Sum(nil)},
		})))
	r, s, err := m.sign(quoted)
	if err != nil {
		return tpm.Quote{}, err
	}
	sig, err := goAttestationSignature(r, s)
	if err != nil {
		return tpm.Quote{}, err
	}
	return tpm.Quote{Quote: quoted, Signature: sig}, nil
}

// EKPublicArea is the EK's TPMT_PUBLIC, what TPM2_ReadPublic of the EK
// returns.
func (m *Machine) EKPublicArea() []byte { return bytes.Clone(m.ekPublic) }

// SRKPublicArea is the SRK's TPMT_PUBLIC.
func (m *Machine) SRKPublicArea() []byte { return bytes.Clone(m.srkPublic) }

// EKCertificate is the EK certificate (DER).
func (m *Machine) EKCertificate() []byte { return bytes.Clone(m.ekCert) }

// AKName is the AK's Name (nameAlg || digest), what the credential is bound to.
func (m *Machine) AKName() []byte { return bytes.Clone(m.akName) }

// PCRs returns the values of PCRs 0-23 of a bank (crypto.SHA1 or
// crypto.SHA256), nil for another bank.
func (m *Machine) PCRs(bank crypto.Hash) [][]byte {
	var src [numPCRs][]byte
	switch bank {
	case crypto.SHA1:
		src = m.banks.sha1
	case crypto.SHA256:
		src = m.banks.sha256
	default:
		return nil
	}
	out := make([][]byte, numPCRs)
	for i := range src {
		out[i] = bytes.Clone(src[i])
	}
	return out
}
