package nitrotpm

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/fxamacker/cbor/v2"
	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// NSM is the Nitro Secure Module's request channel: one request in the
// CBOR form of aws-nitro-enclaves-nsm-api (serde's externally tagged enum:
// {"Attestation": {"user_data": …, "nonce": …, "public_key": …}}), one
// response in the same form ({"Attestation": {"document": …}} or
// {"Error": "<code>"}). On an EC2 instance it is TPMNSM: the NitroTPM's
// vendor command. Tests put a fake behind it that answers with the same
// bytes (nitrotpmtest), because swtpm has neither the vendor command nor
// NV indices of the message buffer's size (its limit is 2048 bytes).
type NSM interface {
	Request(req []byte) ([]byte, error)
}

// nsmRequest is the NSM Attestation request. Absent fields are CBOR null,
// as serde writes None.
type nsmRequest struct {
	Attestation nsmAttestation `cbor:"Attestation"`
}

type nsmAttestation struct {
	UserData  []byte `cbor:"user_data"`
	Nonce     []byte `cbor:"nonce"`
	PublicKey []byte `cbor:"public_key"`
}

// MarshalRequest encodes an NSM Attestation request.
func MarshalRequest(userData, nonce, publicKey []byte) ([]byte, error) {
	return cbor.Marshal(nsmRequest{nsmAttestation{UserData: userData, Nonce: nonce, PublicKey: publicKey}})
}

// UnmarshalRequest decodes an NSM Attestation request (the first CBOR
// item of b: an NV buffer holds it with whatever follows), refusing any
// other request and fields over 1024 bytes, as the NSM does.
func UnmarshalRequest(b []byte) (userData, nonce, publicKey []byte, err error) {
	var req map[string]cbor.RawMessage
	if _, err := decMode.UnmarshalFirst(b, &req); err != nil {
		return nil, nil, nil, fmt.Errorf("nitrotpm: NSM request: %w", err)
	}
	raw, ok := req["Attestation"]
	if !ok || len(req) != 1 {
		return nil, nil, nil, errors.New("nitrotpm: NSM request is not an Attestation request")
	}
	var a nsmAttestation
	if err := decMode.Unmarshal(raw, &a); err != nil {
		return nil, nil, nil, fmt.Errorf("nitrotpm: NSM Attestation request: %w", err)
	}
	if len(a.UserData) > maxUserData || len(a.Nonce) > maxNonce || len(a.PublicKey) > maxPublicKey {
		return nil, nil, nil, errors.New("nitrotpm: NSM Attestation request: a field over 1024 bytes (InputTooLarge)")
	}
	return a.UserData, a.Nonce, a.PublicKey, nil
}

// MarshalResponse encodes an NSM Attestation response carrying document.
func MarshalResponse(document []byte) ([]byte, error) {
	return cbor.Marshal(map[string]map[string][]byte{"Attestation": {"document": document}})
}

// MarshalError encodes an NSM error response ("InvalidArgument", …).
func MarshalError(code string) ([]byte, error) {
	return cbor.Marshal(map[string]string{"Error": code})
}

// Attest asks nsm for an attestation document carrying nonce and
// publicKey (and no user data) and returns the document's bytes.
func Attest(nsm NSM, nonce, publicKey []byte) ([]byte, error) {
	req, err := MarshalRequest(nil, nonce, publicKey)
	if err != nil {
		return nil, err
	}
	resp, err := nsm.Request(req)
	if err != nil {
		return nil, err
	}
	var r map[string]cbor.RawMessage
	if _, err := decMode.UnmarshalFirst(resp, &r); err != nil {
		return nil, fmt.Errorf("nitrotpm: NSM response: %w", err)
	}
	if raw, ok := r["Error"]; ok {
		var code string
		_ = decMode.Unmarshal(raw, &code)
		return nil, fmt.Errorf("nitrotpm: the NSM refused the attestation request: %s", code)
	}
	var a struct {
		Document []byte `cbor:"document"`
	}
	raw, ok := r["Attestation"]
	if !ok || decMode.Unmarshal(raw, &a) != nil || len(a.Document) == 0 || len(a.Document) > MaxDocumentSize {
		return nil, errors.New("nitrotpm: the NSM response is not an attestation document")
	}
	return a.Document, nil
}

// The NitroTPM's NSM vendor command (NitroTPM-Tools, nitro-tpm-attest).
const (
	// VendorCommandNSM is TPM2_VENDOR_AWS_NSM_REQUEST.
	VendorCommandNSM = 0x20000001
	// messageBufferSize is the NV message buffer's size: a document with
	// no optional field is about 5 KiB, each optional field up to 1 KiB.
	messageBufferSize = 8192
	nvIndexFirst      = 0x01000000
	nvIndexLast       = 0x01FFFFFF
	nvChunk           = 512
)

// TPMNSM is the NSM of an EC2 instance's NitroTPM, reached as AWS's
// nitro-tpm-attest reaches it:
//  1. the RSA EK is made (the TCG default template) to salt sessions;
//  2. an NV index, the message buffer, is defined at the first free
//     index of the owner range: authRead and authWrite, name algorithm
//     SHA-512, 8 KiB, a random 64-byte auth value; the request is written
//     into it;
//  3. the vendor command TPM2_VENDOR_AWS_NSM_REQUEST (0x20000001) is sent
//     with the index as both its handles, authorized by a salted HMAC
//     session (SHA-512, salted with the EK; cpHash = SHA-512(command code
//     ‖ name ‖ name));
//  4. the hypervisor writes the response into the buffer, which is read,
//     and the index is undefined.
//
// The auth value travels in the clear when the index is defined (AWS's
// tool encrypts it with the salted session); it only guards the buffer
// from other processes on the instance between the write and the vendor
// command, and what it guards is signed by AWS anyway.
type TPMNSM struct {
	// RW is the TPM command channel (/dev/tpmrm0).
	RW io.ReadWriter
	// Size is the message buffer's size; zero means 8 KiB, AWS's.
	Size int
}

// Request sends req through the vendor command and returns the response.
func (t TPMNSM) Request(req []byte) (resp []byte, err error) {
	size := t.Size
	if size == 0 {
		size = messageBufferSize
	}
	if len(req) > size {
		return nil, fmt.Errorf("nitrotpm: NSM request of %d bytes exceeds the %d-byte buffer", len(req), size)
	}
	ek, ekPub, err := tpm2.CreatePrimary(t.RW, tpm2.HandleEndorsement, tpm2.PCRSelection{}, "", "", client.DefaultEKTemplateRSA())
	if err != nil {
		return nil, fmt.Errorf("nitrotpm: create the EK: %w", err)
	}
	defer tpm2.FlushContext(t.RW, ek)
	salt, ok := ekPub.(*rsa.PublicKey)
	if !ok {
		return nil, errors.New("nitrotpm: the EK is not RSA")
	}
	idx, err := freeNVIndex(t.RW)
	if err != nil {
		return nil, err
	}
	auth := make([]byte, 64)
	if _, err := rand.Read(auth); err != nil {
		return nil, err
	}
	auth[len(auth)-1] |= 1 // no trailing zero for the TPM to strip
	pub := tpm2.NVPublic{NVIndex: idx, NameAlg: tpm2.AlgSHA512, Attributes: tpm2.AttrAuthRead | tpm2.AttrAuthWrite, DataSize: uint16(size)}
	owner := tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession}
	if err := tpm2.NVDefineSpaceEx(t.RW, tpm2.HandleOwner, string(auth), pub, owner); err != nil {
		return nil, fmt.Errorf("nitrotpm: define the NSM message buffer: %w", err)
	}
	defer func() {
		if uerr := tpm2.NVUndefineSpace(t.RW, "", tpm2.HandleOwner, idx); uerr != nil && err == nil {
			err = fmt.Errorf("nitrotpm: undefine the NSM message buffer: %w", uerr)
		}
	}()
	for off := 0; off < len(req); off += nvChunk {
		end := min(off+nvChunk, len(req))
		if err := tpm2.NVWrite(t.RW, idx, idx, string(auth), req[off:end], uint16(off)); err != nil {
			return nil, fmt.Errorf("nitrotpm: write the NSM request: %w", err)
		}
	}
	name, err := nvName(t.RW, idx)
	if err != nil {
		return nil, err
	}
	if err := authorized(t.RW, ek, salt, VendorCommandNSM, []tpmutil.Handle{idx, idx}, [][]byte{name, name}, nil, auth); err != nil {
		return nil, fmt.Errorf("nitrotpm: the NSM vendor command: %w", err)
	}
	out, err := tpm2.NVReadEx(t.RW, idx, idx, string(auth), 0)
	if err != nil {
		return nil, fmt.Errorf("nitrotpm: read the NSM response: %w", err)
	}
	return out, nil
}

// ResponseError is a TPM response code other than success.
type ResponseError uint32

func (e ResponseError) Error() string { return fmt.Sprintf("TPM response code %#x", uint32(e)) }

// RCCommandCode is TPM_RC_COMMAND_CODE: a TPM without the command (any TPM
// but a NitroTPM, for the NSM vendor command).
const RCCommandCode ResponseError = 0x143

// freeNVIndex is the first index of the owner range no NV index holds.
func freeNVIndex(rw io.ReadWriter) (tpmutil.Handle, error) {
	vals, _, err := tpm2.GetCapability(rw, tpm2.CapabilityHandles, 1024, nvIndexFirst)
	if err != nil {
		return 0, fmt.Errorf("nitrotpm: list NV indices: %w", err)
	}
	used := map[tpmutil.Handle]bool{}
	for _, v := range vals {
		if h, ok := v.(tpmutil.Handle); ok {
			used[h] = true
		}
	}
	for h := tpmutil.Handle(nvIndexFirst); h <= nvIndexLast; h++ {
		if !used[h] {
			return h, nil
		}
	}
	return 0, errors.New("nitrotpm: no free NV index")
}

// nvName reads an NV index's name (TPM2_NV_ReadPublic).
func nvName(rw io.ReadWriter, idx tpmutil.Handle) ([]byte, error) {
	resp, _, err := tpmutil.RunCommand(rw, tpm2.TagNoSessions, tpm2.CmdReadPublicNV, idx)
	if err != nil {
		return nil, fmt.Errorf("nitrotpm: read the message buffer's name: %w", err)
	}
	var pub, name tpmutil.U16Bytes
	if _, err := tpmutil.Unpack(resp, &pub, &name); err != nil {
		return nil, fmt.Errorf("nitrotpm: the message buffer's public area: %w", err)
	}
	return name, nil
}

// authorized runs command cc with handles and parameters params,
// authorizing the first handle, whose auth value is authValue, with a new
// salted HMAC session (SHA-512, no symmetric algorithm, salted with the
// RSA key saltKey at saltHandle), the session AWS's tool uses for the NSM
// vendor command (TPM 2.0 Part 1, 19.6: session key = KDFa(SHA-512, salt,
// "ATH", nonceTPM, nonceCaller, 512); HMAC key = session key ‖ auth value;
// HMAC over cpHash ‖ nonceCaller ‖ nonceTPM ‖ attributes). The session is
// flushed after.
func authorized(rw io.ReadWriter, saltHandle tpmutil.Handle, saltKey *rsa.PublicKey, cc uint32, handles []tpmutil.Handle, names [][]byte, params, authValue []byte) error {
	salt := make([]byte, sha256.Size)
	nonceCaller := make([]byte, sha512.Size)
	if _, err := rand.Read(salt); err != nil {
		return err
	}
	if _, err := rand.Read(nonceCaller); err != nil {
		return err
	}
	encSalt, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, saltKey, salt, []byte("SECRET\x00"))
	if err != nil {
		return fmt.Errorf("encrypt the session salt: %w", err)
	}
	sess, nonceTPM, err := tpm2.StartAuthSession(rw, saltHandle, tpm2.HandleNull, nonceCaller, encSalt, tpm2.SessionHMAC, tpm2.AlgNull, tpm2.AlgSHA512)
	if err != nil {
		return fmt.Errorf("start the salted session: %w", err)
	}
	defer tpm2.FlushContext(rw, sess)
	key, err := tpm2.KDFa(tpm2.AlgSHA512, salt, "ATH", nonceTPM, nonceCaller, 512)
	if err != nil {
		return err
	}
	cp := sha512.New()
	binary.Write(cp, binary.BigEndian, cc)
	for _, n := range names {
		cp.Write(n)
	}
	cp.Write(params)
	nonce2 := make([]byte, sha512.Size)
	if _, err := rand.Read(nonce2); err != nil {
		return err
	}
	const attrs = byte(tpm2.AttrContinueSession)
	mac := hmac.New(sha512.New, append(bytes.Clone(key), bytes.TrimRight(authValue, "\x00")...))
	mac.Write(cp.Sum(nil))
	mac.Write(nonce2)
	mac.Write(nonceTPM)
	mac.Write([]byte{attrs})
	var area bytes.Buffer
	binary.Write(&area, binary.BigEndian, uint32(sess))
	binary.Write(&area, binary.BigEndian, uint16(len(nonce2)))
	area.Write(nonce2)
	area.WriteByte(attrs)
	binary.Write(&area, binary.BigEndian, uint16(sha512.Size))
	area.Write(mac.Sum(nil))
	var cmd bytes.Buffer
	binary.Write(&cmd, binary.BigEndian, uint16(tpm2.TagSessions))
	binary.Write(&cmd, binary.BigEndian, uint32(0)) // size, below
	binary.Write(&cmd, binary.BigEndian, cc)
	for _, h := range handles {
		binary.Write(&cmd, binary.BigEndian, uint32(h))
	}
	binary.Write(&cmd, binary.BigEndian, uint32(area.Len()))
	cmd.Write(area.Bytes())
	cmd.Write(params)
	b := cmd.Bytes()
	binary.BigEndian.PutUint32(b[2:6], uint32(len(b)))
	resp, err := tpmutil.RunCommandRaw(rw, b)
	if err != nil {
		return err
	}
	if len(resp) < 10 {
		return errors.New("short response")
	}
	if rc := binary.BigEndian.Uint32(resp[6:10]); rc != 0 {
		return ResponseError(rc)
	}
	return nil
}
