// Package aws is nodeproof's AWS evidence: the EC2 instance identity
// document, signed by AWS with the Region's RSA-2048 key (the rsa2048
// PKCS#7). Collect (node side) reads it from the instance metadata service
// over IMDSv2 only (NewIMDSClient; a refused token PUT is an error, never a
// fall back to IMDSv1); Verifier (server side) checks it and returns
// attest.Claims; attest/policy decides what they may have.
//
// What the evidence proves: AWS launched instance <instanceId> in account
// <accountId>, Region, Availability Zone, with that image, type and primary
// private IP, at pendingTime. Every claim is read from the signed content of
// the PKCS#7 and from nothing else; the unsigned document a node also sends
// is compared with it and refused when it differs (DocumentSubstituted). The Region's certificate
// comes from configuration (DefaultRegionCerts, shipped in certs/ with its
// source in certs/README.md, or LoadRegionCerts); certificates inside a
// PKCS#7 are never used.
//
// # Residual risk: the first use wins
//
// AWS signs the document once, when the instance starts. It carries no
// nonce and no kubelet key, and the same bytes are served to anything that
// can reach the instance's metadata service for as long as the instance
// runs. So the evidence proves which instance a document describes, not who
// presents it: whoever presents a copy first, with their own kubelet key,
// enrolls as that instance. The session nonce makes the session single-use
// but cannot be bound into the document. These narrow the window; a
// deployment should use all that apply:
//
//   - A short Options.MaxDocumentAge (default one hour after pendingTime): a
//     document is useless to anyone once its instance has been up longer.
//   - One enrolment per instance: the server binds the instance's identity
//     (aws:<account>/<region>/<instance id>) to its node name in the same
//     write as the enrolment record (mcs, store.Enrol), so an instance
//     enrols once; enrolling again needs a proof of the kubelet key that
//     enrolment bound. If the attacker won, the real node is refused and
//     the conflict is visible (an Event), not silent.
//   - The live check (Options.Live; identity/aws/ec2live asks the EC2
//     API): the instance must be running now, in the expected VPC, with the
//     expected tags, so a document of a stopped or foreign instance is
//     refused.
//   - On the instances: IMDSv2 required and a PUT response hop limit of 1,
//     so containers and other hosts cannot read the document.
//   - Where the instance type has it, NitroTPM with the TPM evidence path
//     (attest/tpm), whose quote binds the server's nonce and the kubelet
//     key, so a copied quote is worthless.
//
// # Re-enrolling a reinstalled instance
//
// An instance reinstalled in place (a new root volume, a reinstalled OS, a
// reboot) keeps its identity, and its new kubelet key is refused with
// IdentityAlreadyEnrolled (docs/protocol.md, "Who owns a node name").
//
//   - Release its node (`nodeproof release NODE`; the refusal names it);
//     the instance then enrols once more, with its new key.
//   - After MaxDocumentAge the document itself is refused (DocumentTooOld)
//     whatever the store holds. Stop and start the instance (a reboot is
//     not enough): EC2 then signs a new document with a new pendingTime.
//
// Account and Region allow-lists, and whether a live check is required,
// are policy's (attest/policy); one use per instance is the store's.
package aws
