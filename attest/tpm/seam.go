package tpm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/nodeproof/nodeproof/attest"
)

// Seam is v as an attest.Verifier: the server's one view of every kind.
// Before any cryptography, Challenge admits the EK the request claims
// (ChallengeInput.Admit with "tpm-ek-claimed/<hex SHA-256 of the EK
// PKIX DER>"): a flood naming one TPM spends that TPM's budget. The
// node's AK ticket, when the server opened one, goes to
// ChallengeTicketed.
func (v *Verifier) Seam() attest.Verifier {
	return attest.Seam(attest.KindTPM, func(in attest.ChallengeInput, req *ChallengeRequest) (any, *attest.Session, error) {
		ek := sha256.Sum256(req.EKPublic)
		if err := in.AdmitClaimed("tpm-ek-claimed/" + hex.EncodeToString(ek[:])); err != nil {
			return nil, nil, err
		}
		return v.ChallengeTicketed(in.Pool, in.KubeletKeySHA256, req, in.Ticket)
	}, func(_ context.Context, sess *attest.Session, ev *Evidence) (*attest.Claims, error) {
		return v.Verify(sess, ev)
	})
}
