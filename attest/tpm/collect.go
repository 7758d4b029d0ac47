package tpm

import (
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	goattest "github.com/google/go-attestation/attest"

	"github.com/nodeproof/nodeproof/attest"
)

// The node side. A Collector drives a real TPM through go-attestation: it
// reads the EK (and its certificate from NV), makes an attestation key,
// activates the server's credential and quotes the PCRs over the binding
// the server asked for. It never decides anything.

// SystemEventLog is where Linux exposes the firmware's TCG event log.
const SystemEventLog = "/sys/kernel/security/tpm0/binary_bios_measurements"

// Channel is a TPM command channel with the machine's event log beside it.
type Channel interface {
	io.ReadWriteCloser
	MeasurementLog() ([]byte, error)
}

// Collector produces TPM evidence on the node.
type Collector struct {
	log func() ([]byte, error)
	tpm *goattest.TPM
	ek  goattest.EK
	ak  *goattest.AK
}

// NewCollector opens the TPM behind ch (nil: the system TPM, /dev/tpmrm0,
// with the system event log), picks its RSA 2048 EK and makes an ECDSA
// P-256 attestation key (an RSA AK takes a software TPM about 100 times
// longer). NewCollectorEK picks another kind of EK.
func NewCollector(ch Channel) (*Collector, error) { return NewCollectorEK(ch, attest.EKKindRSA2048) }

// NewCollectorEK is NewCollector with the EK of kind ekKind
// (attest.EKKinds): a pool accepts one kind, and a TPM holds one of each
// kind its vendor certified. Of two EKs of the kind, the one with a
// certificate; none of the kind is an error naming the kinds it has.
func NewCollectorEK(ch Channel, ekKind string) (*Collector, error) {
	cfg := &goattest.OpenConfig{}
	if ch != nil {
		cfg.CommandChannel = ch
	}
	t, err := goattest.OpenTPM(cfg)
	if err != nil {
		return nil, fmt.Errorf("open TPM: %w", err)
	}
	c := &Collector{tpm: t, log: systemEventLog}
	if ch != nil {
		c.log = ch.MeasurementLog
	}
	// The certified EKs (RSA and ECC, each with its certificate from NV),
	// then what EKs finds (an RSA EK made from its template when no
	// certificate is there: an inventory's).
	certified, cerr := t.EKCertificates()
	eks, err := t.EKs()
	eks = append(certified, eks...)
	if len(eks) == 0 {
		t.Close()
		return nil, fmt.Errorf("read endorsement key: %w", errors.Join(cerr, err, errors.New("no EK")))
	}
	found, kinds := false, []string{}
	for _, ek := range eks {
		k := EKKindOf(ek.Public)
		kinds = append(kinds, k)
		if k == ekKind && (!found || (c.ek.Certificate == nil && ek.Certificate != nil)) {
			c.ek, found = ek, true
		}
	}
	if !found {
		t.Close()
		return nil, fmt.Errorf("the TPM has no %s endorsement key (it has %v): the pool's tpm.ek says which to use (--ek)", ekKind, kinds)
	}
	c.ak, err = t.NewAK(&goattest.AKConfig{Algorithm: goattest.ECDSA})
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("create attestation key: %w", err)
	}
	return c, nil
}

// Close flushes the AK and closes the TPM.
func (c *Collector) Close() error {
	err := c.ak.Close(c.tpm)
	return errors.Join(err, c.tpm.Close())
}

// Request returns the first message: the EK, its certificate, and the AK's
// parameters.
func (c *Collector) Request() (*ChallengeRequest, error) {
	pub, err := x509.MarshalPKIXPublicKey(c.ek.Public)
	if err != nil {
		return nil, fmt.Errorf("encode EK: %w", err)
	}
	req := &ChallengeRequest{EKPublic: pub}
	if c.ek.Certificate != nil {
		req.EKCertificate = c.ek.Certificate.Raw
	}
	p := c.ak.AttestationParameters()
	req.AK = AKParameters{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}
	return req, nil
}

// Answer activates the challenge's credential and quotes all PCRs of the
// SHA-256 bank (SHA-1 only when the TPM has no SHA-256 bank) with
// qualifying data attest.BindingDigest(challenge nonce, kubeletKeySHA256).
// The event log comes from the channel.
func (c *Collector) Answer(ch *Challenge, kubeletKeySHA256 []byte) (*Evidence, error) {
	binding := attest.BindingDigest(ch.Nonce, kubeletKeySHA256)
	secret, err := c.ak.ActivateCredentialWithEK(c.tpm, goattest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret}, c.ek)
	if err != nil {
		return nil, fmt.Errorf("activate credential: %w", err)
	}
	banks, err := c.tpm.PCRBanks()
	if err != nil {
		return nil, fmt.Errorf("read PCR banks: %w", err)
	}
	alg := goattest.HashSHA1
	for _, b := range banks {
		if b == goattest.HashSHA256 {
			alg = b
		}
	}
	q, err := c.ak.Quote(c.tpm, binding, alg)
	if err != nil {
		return nil, fmt.Errorf("quote: %w", err)
	}
	pcrs, err := c.tpm.PCRs(alg)
	if err != nil {
		return nil, fmt.Errorf("read PCRs: %w", err)
	}
	ev := &Evidence{KubeletKeySHA256: kubeletKeySHA256, ActivationSecret: secret, Quotes: []Quote{{Quote: q.Quote, Signature: q.Signature}}}
	for _, p := range pcrs {
		ev.PCRs = append(ev.PCRs, PCR{Index: p.Index, Bank: bankName(p.DigestAlg), Digest: p.Digest})
	}
	if ev.EventLog, err = c.log(); err != nil {
		return nil, fmt.Errorf("read event log: %w", err)
	}
	return ev, nil
}

// ReadSystemEventLog reads the firmware's event log (SystemEventLog); a
// machine without one (no UEFI measured boot) sends none, and its boot
// state is unknown.
func ReadSystemEventLog() ([]byte, error) { return systemEventLog() }

func systemEventLog() ([]byte, error) {
	b, err := os.ReadFile(SystemEventLog)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// SocketChannel is a TPM command channel over a stream socket, as swtpm
// serves with `--server type=tcp` or `type=unixio`. A stream has no
// message boundaries, so each response is read whole: the 10-byte header,
// then the rest of the size it gives.
type SocketChannel struct {
	conn    net.Conn
	log     []byte
	pending []byte
	timeout time.Duration
}

// DialSocket connects to a TPM command socket ("tcp" or "unix"). log is
// the event log to report with quotes (a software TPM has no firmware to
// write one).
func DialSocket(network, addr string, log []byte) (*SocketChannel, error) {
	conn, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("connect to TPM at %s: %w", addr, err)
	}
	return &SocketChannel{conn: conn, log: log, timeout: 2 * time.Minute}, nil
}

// maxTPMResponse bounds a response's declared size.
const maxTPMResponse = 1 << 16

// Write sends one command.
func (s *SocketChannel) Write(p []byte) (int, error) {
	if err := s.conn.SetDeadline(time.Now().Add(s.timeout)); err != nil {
		return 0, err
	}
	return s.conn.Write(p)
}

// Read returns the response to the last command, whole, across as many
// calls as p's size needs.
func (s *SocketChannel) Read(p []byte) (int, error) {
	if len(s.pending) == 0 {
		hdr := make([]byte, 10)
		if _, err := io.ReadFull(s.conn, hdr); err != nil {
			return 0, fmt.Errorf("read TPM response header: %w", err)
		}
		size := binary.BigEndian.Uint32(hdr[2:6])
		if size < 10 || size > maxTPMResponse {
			return 0, fmt.Errorf("TPM response size %d out of range", size)
		}
		resp := make([]byte, size)
		copy(resp, hdr)
		if _, err := io.ReadFull(s.conn, resp[10:]); err != nil {
			return 0, fmt.Errorf("read TPM response: %w", err)
		}
		s.pending = resp
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// Close closes the socket.
func (s *SocketChannel) Close() error { return s.conn.Close() }

// MeasurementLog returns the event log given to DialSocket.
func (s *SocketChannel) MeasurementLog() ([]byte, error) { return s.log, nil }

// SetEventLog replaces the event log reported with quotes.
func (s *SocketChannel) SetEventLog(log []byte) { s.log = log }
