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
	// kept is set when ak is the kept AK (CollectorOptions.AK), loaded;
	// keptErr says why a kept AK did not load (a new one was made).
	kept    bool
	keptErr error
	// activations counts the credentials Answer activated.
	activations int
}

// storageRoot is the parent of the AK: the ECC P-256 storage root key at
// the handle the TCG's provisioning guidance gives it (0x81000002), made
// from the owner hierarchy's template the first time and persisted. An
// ECC key because making one is a scalar multiplication where an RSA
// 2048 key (go-attestation's default SRK) is a search for primes, the
// slowest command a TPM runs; the SRK only wraps the AK, so nothing
// outside the TPM sees which it is.
var storageRoot = goattest.ParentKeyConfig{Algorithm: goattest.ECDSA, Handle: 0x81000002}

// CollectorOptions say which EK a Collector attests with and whether it
// reuses an AK it made before.
type CollectorOptions struct {
	// EKKind is the kind of EK (attest.EKKinds; "": attest.EKKindRSA2048):
	// a pool accepts one kind, and a TPM holds one of each kind its vendor
	// certified.
	EKKind string
	// AK is an attestation key this TPM made before (Collector.KeepAK),
	// loaded instead of making a new one: TPM2_Load under the storage root
	// key, no key generation. A blob that does not load — another TPM's,
	// or this TPM's after a TPM2_Clear replaced its storage root — is left
	// and a new AK made (Collector.KeptAK says so).
	AK []byte
}

// NewCollector opens the TPM behind ch (nil: the system TPM, /dev/tpmrm0,
// with the system event log), picks its RSA 2048 EK and makes an ECDSA
// P-256 attestation key (an RSA AK takes a software TPM about 100 times
// longer). NewCollectorEK picks another kind of EK.
func NewCollector(ch Channel) (*Collector, error) { return NewCollectorWith(ch, CollectorOptions{}) }

// NewCollectorEK is NewCollector with the EK of kind ekKind
// (attest.EKKinds).
func NewCollectorEK(ch Channel, ekKind string) (*Collector, error) {
	return NewCollectorWith(ch, CollectorOptions{EKKind: ekKind})
}

// NewCollectorWith is NewCollector with o: the EK of kind o.EKKind (of two
// EKs of the kind, the one with a certificate; none of the kind is an
// error naming the kinds it has) and the kept AK o.AK when it loads.
func NewCollectorWith(ch Channel, o CollectorOptions) (*Collector, error) {
	ekKind := o.EKKind
	if ekKind == "" {
		ekKind = attest.EKKindRSA2048
	}
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
	if len(o.AK) > 0 {
		if c.ak, c.keptErr = t.LoadAKWithParent(o.AK, storageRoot); c.keptErr == nil {
			c.kept = true
			return c, nil
		}
	}
	parent := storageRoot
	c.ak, err = t.NewAK(&goattest.AKConfig{Algorithm: goattest.ECDSA, Parent: &parent})
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("create attestation key: %w", err)
	}
	return c, nil
}

// KeptAK reports whether the AK is the kept one (CollectorOptions.AK),
// and when a kept AK was given but did not load, why.
func (c *Collector) KeptAK() (bool, error) { return c.kept, c.keptErr }

// Activations is how many credentials Answer activated (none for the
// challenges an AK ticket spared).
func (c *Collector) Activations() int { return c.activations }

// KeepAK returns the AK as a blob for CollectorOptions.AK: its public
// area, creation proof and private part wrapped by this TPM's storage
// root key (go-attestation's AK.Marshal), which only this TPM can load.
func (c *Collector) KeepAK() ([]byte, error) { return c.ak.Marshal() }

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

// Answer activates the challenge's credential (none when the challenge
// carries none: the server took the AK's ticket) and quotes all PCRs of
// the SHA-256 bank (SHA-1 only when the TPM has no SHA-256 bank) with
// qualifying data attest.BindingDigest(challenge nonce, kubeletKeySHA256).
// The event log comes from the channel.
func (c *Collector) Answer(ch *Challenge, kubeletKeySHA256 []byte) (*Evidence, error) {
	binding := attest.BindingDigest(ch.Nonce, kubeletKeySHA256)
	var secret []byte
	if len(ch.Credential) > 0 || len(ch.Secret) > 0 {
		var err error
		if secret, err = c.ak.ActivateCredentialWithEK(c.tpm, goattest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret}, c.ek); err != nil {
			return nil, fmt.Errorf("activate credential: %w", err)
		}
		c.activations++
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
