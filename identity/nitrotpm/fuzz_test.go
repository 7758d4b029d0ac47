package nitrotpm_test

import (
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
	"github.com/nodeproof/nodeproof/identity/nitrotpm/nitrotpmtest"
)

// FuzzParseDocument: any bytes as an attestation document are refused
// with NitroDocumentMalformed or parse into a document within every bound
// (Verify is a signature and chain check of what parses, covered by the
// attack rows). Seeds: the real document and a test one.
func FuzzParseDocument(f *testing.F) {
	real := realDocument(f)
	f.Add(real)
	pki, err := nitrotpmtest.NewPKI("i-1234567890abcdef0", "us-east-1", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	doc, err := pki.Sign(pki.Payload(time.Now(), map[int][]byte{0: make([]byte, 48)}, []byte("u"), make([]byte, 32), []byte{1}))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(doc)
	roots := rootPool(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := nitrotpm.ParseDocument(b)
		if err != nil {
			if r, _ := attest.ReasonOf(err); r != attest.ReasonNitroDocMalformed {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		if d.ModuleID == "" || len(d.PCRs) == 0 || len(d.PCRs) > 32 || d.Certificate == nil || len(d.CABundle) == 0 || len(d.PublicKey) > 1024 || len(d.Nonce) > 1024 {
			t.Fatalf("accepted a document out of bounds: %+v", d)
		}
		for i, v := range d.PCRs {
			if i < 0 || i > 31 || len(v) != 48 {
				t.Fatalf("PCR %d of %d bytes", i, len(v))
			}
		}
		if string(b) == string(real) {
			if err := d.Verify(roots, d.Timestamp); err != nil {
				t.Fatalf("the real document: %v", err)
			}
		}
	})
}

// FuzzNSMMessages: the NSM request and response decoders (the node's and
// the fake hypervisor's) never panic, and a request that decodes
// re-encodes to one that decodes to the same fields.
func FuzzNSMMessages(f *testing.F) {
	req, _ := nitrotpm.MarshalRequest(nil, make([]byte, 32), []byte{1, 2, 3})
	resp, _ := nitrotpm.MarshalResponse([]byte{0x84})
	errResp, _ := nitrotpm.MarshalError("InvalidArgument")
	for _, s := range [][]byte{req, resp, errResp} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = nitrotpm.Attest(nsmFunc(func([]byte) ([]byte, error) { return b, nil }), nil, nil)
		u, n, p, err := nitrotpm.UnmarshalRequest(b)
		if err != nil {
			return
		}
		again, err := nitrotpm.MarshalRequest(u, n, p)
		if err != nil {
			t.Fatal(err)
		}
		u2, n2, p2, err := nitrotpm.UnmarshalRequest(again)
		if err != nil || string(u2) != string(u) || string(n2) != string(n) || string(p2) != string(p) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
