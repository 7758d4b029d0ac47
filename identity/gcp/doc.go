// Package gcp is nodeproof's GCP evidence: Compute Engine instance
// identity tokens, node side (Collect) and server side (Verifier).
//
// The protocol has two steps, like every kind. The server's Challenge
// names an audience, AudiencePrefix + AudiencePath +
// base64url(attest.BindingDigest(nonce, kubelet key hash)); the node asks
// its metadata server for an identity token for that audience in full
// format and sends it back; Verify checks the token is an RS256 JWS signed
// by one of Google's keys (go-jose does the JWS; a KeySource, normally a
// JWKSSource on GoogleJWKSURL, supplies the keys), issued by
// https://accounts.google.com, fresh, minted for exactly the session's
// audience, and carrying well-formed google.compute_engine claims. Because
// the audience binds one nonce and one kubelet key, a token captured from
// one enrolment cannot serve another session or another key.
//
// What the verifier establishes is authenticity, as attest.Claims; which
// projects, zones and instance ages may have a pool is attest/policy's.
// Nothing here logs or keeps global state; clocks are passed in.
//
// Package gcptest is a loopback metadata server and JWKS endpoint speaking
// the real protocol, for tests.
package gcp
