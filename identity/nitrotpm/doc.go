// Package nitrotpm is nodeproof's AWS NitroTPM evidence: an EC2 instance's
// TPM, whose quote AWS vouches for through the Nitro hypervisor. On the
// node, a Collector makes an attestation key, asks the Nitro Secure Module
// (the NitroTPM's vendor command, NSM) for an attestation document that
// carries the server's nonce and that key, and quotes the SHA-384 bank with
// it; beside the document goes the instance identity document
// (identity/aws).
//
// On the server, Verifier checks the document (COSE_Sign1, ES384, its
// certificate chained to the pinned AWS Nitro root G1), that it names the
// same instance and Region as the identity document, that its public key
// is the AK, that the quote verifies as attest/tpm verifies one and that
// every PCR it quotes is the value AWS signed, then replays the event log
// and reads the boot state as on bare metal. One verification names the
// instance and proves its boot. Verify's doc comment lists every check and
// its reason; docs/cloud-tpm.md describes the evidence and what it does not
// prove.
package nitrotpm
