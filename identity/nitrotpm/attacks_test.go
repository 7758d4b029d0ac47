package nitrotpm_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
	"github.com/nodeproof/nodeproof/identity/nitrotpm/nitrotpmtest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// TestAttackNitroTPM is the NitroTPM evidence attacked: documents that
// are not AWS's or not this session's, that name another key, other PCRs
// or another instance, quotes by other keys or of other banks, and boots
// that are not the signed one.
func TestAttackNitroTPM(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, nil)
	ctx := context.Background()
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherPKIX, _ := x509.MarshalPKIXPublicKey(otherKey.Public())
	forger, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	foreign, err := nitrotpmtest.NewPKI(w.iid.InstanceID, "us-east-1", w.now)
	if err != nil {
		t.Fatal(err)
	}
	other := w.iid
	other.InstanceID = "i-0fedcba9876543210"
	otherIID, err := w.identityOf(other)
	if err != nil {
		t.Fatal(err)
	}

	impostor, err := awstest.NewRegionWith("us-east-1", awstest.RegionOptions{Subject: w.region.Cert.Subject, Serial: w.region.Cert.SerialNumber})
	if err != nil {
		t.Fatal(err)
	}
	ff, err := impostor.Files(w.iid)
	if err != nil {
		t.Fatal(err)
	}
	forgedIID := aws.Evidence{Document: ff.Document, PKCS7: ff.RSA2048}

	// Documents the fake NSM makes with the payload changed.
	swap := func(f func(*nitrotpmtest.Payload)) nitrotpm.NSM {
		return &nitrotpmtest.NSM{PKI: w.pki, TPM: w.tpm, Clock: time.Now, Swap: f}
	}
	// Documents signed otherwise.
	type signer func(pl *nitrotpmtest.Payload) ([]byte, error)
	signed := func(sign signer) nitrotpm.NSM {
		return nsmFunc(func(req []byte) ([]byte, error) {
			_, nonce, pub, err := nitrotpm.UnmarshalRequest(req)
			if err != nil {
				return nil, err
			}
			pcrs, err := nitrotpmtest.ReadSHA384(w.tpm)
			if err != nil {
				return nil, err
			}
			doc, err := sign(w.pki.Payload(time.Now(), pcrs, nil, nonce, pub))
			if err != nil {
				return nil, err
			}
			return nitrotpm.MarshalResponse(doc)
		})
	}
	enclaveShaped := signed(func(pl *nitrotpmtest.Payload) ([]byte, error) {
		m := map[string]any{"module_id": pl.ModuleID, "digest": "SHA384", "timestamp": pl.Timestamp, "pcrs": pl.NitroTPMPCRs,
			"certificate": pl.Certificate, "cabundle": pl.CABundle, "public_key": pl.PublicKey, "nonce": pl.Nonce}
		b, err := cbor.Marshal(m)
		if err != nil {
			return nil, err
		}
		return w.pki.SignBytes(b, nil)
	})

	type mut func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence)
	none := func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) { return s, ev }
	cases := []struct {
		name string
		want attest.Reason
		nsm  nitrotpm.NSM
		mut  mut
	}{
		{"a document carrying another nonce", attest.ReasonNitroDocNonce, swap(func(p *nitrotpmtest.Payload) { p.Nonce = make([]byte, 32) }), none},
		{"a document carrying no nonce", attest.ReasonNitroDocNonce, swap(func(p *nitrotpmtest.Payload) { p.Nonce = nil }), none},
		{"a document carrying another public key", attest.ReasonNitroDocKey, swap(func(p *nitrotpmtest.Payload) { p.PublicKey = otherPKIX }), none},
		{"a document carrying no public key", attest.ReasonNitroDocKey, swap(func(p *nitrotpmtest.Payload) { p.PublicKey = nil }), none},
		{"a document whose PCR 7 differs from the quoted one", attest.ReasonNitroPCRs, swap(func(p *nitrotpmtest.Payload) {
			p.NitroTPMPCRs[7] = append([]byte(nil), p.NitroTPMPCRs[7]...)
			p.NitroTPMPCRs[7][0] ^= 1
		}), none},
		{"a document without a quoted PCR", attest.ReasonNitroPCRs, swap(func(p *nitrotpmtest.Payload) { delete(p.NitroTPMPCRs, 4) }), none},
		{"a document made before the session", attest.ReasonNitroDocTime, swap(func(p *nitrotpmtest.Payload) { p.Timestamp -= 10 * 60 * 1000 }), none},
		{"a document from the future", attest.ReasonNitroDocTime, swap(func(p *nitrotpmtest.Payload) { p.Timestamp += 10 * 60 * 1000 }), none},
		{"a document whose module_id names another instance", attest.ReasonNitroInstance, swap(func(p *nitrotpmtest.Payload) { p.ModuleID = "i-0fedcba9876543210-tpm0000000000000000" }), none},
		{"a document whose module_id has an unknown shape", attest.ReasonNitroInstance, swap(func(p *nitrotpmtest.Payload) { p.ModuleID = "tpm-i-1234567890abcdef0" }), none},
		{"a document with digest SHA256", attest.ReasonNitroDocMalformed, swap(func(p *nitrotpmtest.Payload) { p.Digest = "SHA256" }), none},
		{"a Nitro Enclaves document (pcrs, not nitrotpm_pcrs)", attest.ReasonNitroDocMalformed, enclaveShaped, none},
		{"a document signed by a key other than its certificate's", attest.ReasonNitroDocSignature, signed(func(pl *nitrotpmtest.Payload) ([]byte, error) { return w.pki.SignWith(pl, forger) }), none},
		{"a document from a PKI with AWS's names and other keys", attest.ReasonNitroDocUntrusted, signed(func(pl *nitrotpmtest.Payload) ([]byte, error) {
			fpl := foreign.Payload(time.UnixMilli(int64(pl.Timestamp)), pl.NitroTPMPCRs, nil, pl.Nonce, pl.PublicKey)
			return foreign.Sign(fpl)
		}), none},
		{"no document", attest.ReasonNitroDocMalformed, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.Document = nil
			return s, ev
		}},
		{"a document one byte short", attest.ReasonNitroDocMalformed, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.Document = ev.Document[:len(ev.Document)-1]
			return s, ev
		}},
		{"the identity document of another instance beside this instance's attestation document", attest.ReasonNitroInstance, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.Identity = otherIID
			return s, ev
		}},
		{"an identity document signed by a key with the Region certificate's name and serial", attest.ReasonDocSignature, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.Identity = forgedIID
			return s, ev
		}},
		{"another key's AK and quote beside the document", attest.ReasonNitroDocKey, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.AKPublic, ev.Quote.Quotes = otherAK(t, w, s, ev)
			return s, ev
		}},
		{"a quote by another key than the document's AK", attest.ReasonQuoteSignature, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			_, ev.Quote.Quotes = otherAK(t, w, s, ev)
			return s, ev
		}},
		{"a quote of the SHA-256 bank only", attest.ReasonNoSHA256Bank, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.Quote.Quotes, ev.Quote.PCRs = sha256Quote(t, w, s, ev)
			return s, ev
		}},
		{"a quoted PCR value changed", attest.ReasonQuotePCRDigest, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.Quote.PCRs[7].Digest[0] ^= 1
			return s, ev
		}},
		{"evidence replayed into a new session (document and quote of the old nonce)", attest.ReasonNitroDocNonce, w.nsm, func(_ *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			_, s, err := v.Challenge("workers", ev.Quote.KubeletKeySHA256, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s, ev
		}},
		{"kubelet key hash swapped in the evidence", attest.ReasonQuoteBinding, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.Quote.KubeletKeySHA256 = testenv.KubeletKeySHA256(t)
			return s, ev
		}},
		{"the event log of another boot", attest.ReasonEventLogReplay, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			ev.Quote.EventLog = firmwaretestdata.MustLog("coreos-36-shielded-vm-no-secure-boot-eventlog")
			return s, ev
		}},
		{"a GCE vTPM session", attest.ReasonSessionInvalid, w.nsm, func(s *attest.Session, ev *nitrotpm.Evidence) (*attest.Session, *nitrotpm.Evidence) {
			s.Kind = attest.KindGCEVTPM
			return s, ev
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sess, ev := w.attestation(t, v, c.nsm)
			sess, ev = c.mut(sess, clone(t, ev))
			_, err := v.Verify(ctx, sess, ev)
			attacktable.CheckRefusal(t, "NitroTPM", c.name, c.want, err)
		})
	}
	t.Run("leaf certificate expired", func(t *testing.T) {
		later := w.now.Add(4 * time.Hour)
		lv := w.verifier(t, func() time.Time { return later })
		sess, ev := w.attestation(t, lv, w.nsm)
		_, err := w.verifier(t, func() time.Time { return later.Add(time.Minute) }).Verify(ctx, sess, ev)
		attacktable.CheckRefusal(t, "NitroTPM", "a document whose leaf certificate has expired", attest.ReasonNitroDocExpired, err)
	})
}

type nsmFunc func([]byte) ([]byte, error)

func (f nsmFunc) Request(b []byte) ([]byte, error) { return f(b) }

// otherAK quotes this session's binding with a key of the same TPM that
// is not the document's AK (an RSA AK).
func otherAK(t *testing.T, w *world, s *attest.Session, ev *nitrotpm.Evidence) ([]byte, []tpm.Quote) {
	t.Helper()
	k, err := client.NewKey(w.tpm, tpm2.HandleOwner, client.AKTemplateRSA())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	q, err := k.Quote(sha384Selection(), attest.BindingDigest(s.Nonce, ev.Quote.KubeletKeySHA256))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := k.PublicArea().Encode()
	if err != nil {
		t.Fatal(err)
	}
	return pub, []tpm.Quote{{Quote: q.GetQuote(), Signature: q.GetRawSig()}}
}

// sha256Quote quotes the SHA-256 bank with the document's AK.
func sha256Quote(t *testing.T, w *world, s *attest.Session, ev *nitrotpm.Evidence) ([]tpm.Quote, []tpm.PCR) {
	t.Helper()
	k, err := client.NewKey(w.tpm, tpm2.HandleOwner, client.AKTemplateECC())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	sel := tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: sha384Selection().PCRs}
	q, err := k.Quote(sel, attest.BindingDigest(s.Nonce, ev.Quote.KubeletKeySHA256))
	if err != nil {
		t.Fatal(err)
	}
	var pcrs []tpm.PCR
	for i, d := range q.GetPcrs().GetPcrs() {
		pcrs = append(pcrs, tpm.PCR{Index: int(i), Bank: "sha256", Digest: d})
	}
	return []tpm.Quote{{Quote: q.GetQuote(), Signature: q.GetRawSig()}}, pcrs
}

func sha384Selection() tpm2.PCRSelection {
	sel := tpm2.PCRSelection{Hash: tpm2.AlgSHA384}
	for i := 0; i < 24; i++ {
		sel.PCRs = append(sel.PCRs, i)
	}
	return sel
}
