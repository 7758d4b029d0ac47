package nitrotpm

import (
	"context"
	"crypto/rsa"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/internal/swtpm"
)

// startTPM runs a swtpm for one test and returns its command channel.
func startTPM(t *testing.T) *tpm.SocketChannel {
	t.Helper()
	man, err := swtpm.NewManufacturer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := man.Provision(context.Background(), dir, "sha256,sha384"); err != nil {
		t.Fatal(err)
	}
	p, err := swtpm.Start(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	ch, err := tpm.DialSocket("tcp", p.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

// TestAuthorizedSession holds the hand-made salted HMAC session that
// authorizes the NSM vendor command to a real TPM: swtpm (libtpms, the
// reference implementation) runs TPM2_NV_Read of an index like the
// message buffer (SHA-512 name, authRead) authorized by it, and refuses
// it with a wrong auth value. What differs for the vendor command is only
// the command code and that it has no parameters.
func TestAuthorizedSession(t *testing.T) {
	rw := startTPM(t)
	ek, ekPub, err := tpm2.CreatePrimary(rw, tpm2.HandleEndorsement, tpm2.PCRSelection{}, "", "", client.DefaultEKTemplateRSA())
	if err != nil {
		t.Fatal(err)
	}
	defer tpm2.FlushContext(rw, ek)
	idx := tpmutil.Handle(0x01000000)
	auth := []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	pub := tpm2.NVPublic{NVIndex: idx, NameAlg: tpm2.AlgSHA512, Attributes: tpm2.AttrAuthRead | tpm2.AttrAuthWrite, DataSize: 64}
	if err := tpm2.NVDefineSpaceEx(rw, tpm2.HandleOwner, string(auth), pub, tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession}); err != nil {
		t.Fatal(err)
	}
	if err := tpm2.NVWrite(rw, idx, idx, string(auth), []byte("message"), 0); err != nil {
		t.Fatal(err)
	}
	name, err := nvName(rw, idx)
	if err != nil {
		t.Fatal(err)
	}
	params := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, 7), 0) // size 7, offset 0
	const ccNVRead = 0x0000014E
	if err := authorized(rw, ek, ekPub.(*rsa.PublicKey), ccNVRead, []tpmutil.Handle{idx, idx}, [][]byte{name, name}, params, auth); err != nil {
		t.Fatalf("NV_Read with the salted session: %v", err)
	}
	wrong := append([]byte(nil), auth...)
	wrong[0] ^= 1
	var rerr ResponseError
	if err := authorized(rw, ek, ekPub.(*rsa.PublicKey), ccNVRead, []tpmutil.Handle{idx, idx}, [][]byte{name, name}, params, wrong); !errors.As(err, &rerr) {
		t.Fatalf("NV_Read with a wrong auth value: %v, want a TPM refusal", err)
	}
}

// TestTPMNSMOnSwtpm runs the whole vendor-command exchange against swtpm,
// which lacks the command: every step a TPM can check runs (the EK, the
// buffer's definition and write, the salted session), the vendor command
// is refused as TPM_RC_COMMAND_CODE and nothing is left behind: no NV
// index, no session, no object.
func TestTPMNSMOnSwtpm(t *testing.T) {
	rw := startTPM(t)
	handles := func() map[uint32]bool {
		out := map[uint32]bool{}
		for _, first := range []uint32{nvIndexFirst, 0x02000000, 0x03000000, 0x80000000} {
			vals, _, err := tpm2.GetCapability(rw, tpm2.CapabilityHandles, 64, first)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				if h := uint32(v.(tpmutil.Handle)); h>>24 == first>>24 {
					out[h] = true
				}
			}
		}
		return out
	}
	before := handles()
	req, err := MarshalRequest(nil, make([]byte, 32), make([]byte, 91))
	if err != nil {
		t.Fatal(err)
	}
	_, err = TPMNSM{RW: rw, Size: 2048}.Request(req)
	if !errors.Is(err, RCCommandCode) {
		t.Fatalf("got %v, want %v", err, RCCommandCode)
	}
	for h := range handles() {
		if !before[h] {
			t.Errorf("handle %#x left behind", h)
		}
	}
}
