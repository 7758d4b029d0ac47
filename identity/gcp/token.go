package gcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// The claims of an instance identity token, read strictly. The JWS itself
// (form, algorithm, signature) is go-jose's to parse and verify (verify.go);
// this file only reads the payload that signature covered.

// tokenClaims are the members of an instance identity token we read. Every
// other member is ignored. Members are kept raw and read one by one, so a
// member of the wrong JSON type is refused by the check that owns it, with
// that check's reason.
type tokenClaims struct {
	Iss    json.RawMessage `json:"iss"`
	Aud    json.RawMessage `json:"aud"`
	Exp    json.RawMessage `json:"exp"`
	Iat    json.RawMessage `json:"iat"`
	Nbf    json.RawMessage `json:"nbf"`
	Email  json.RawMessage `json:"email"`
	Google json.RawMessage `json:"google"`
}

// computeEngine is google.compute_engine of a format=full token. Google
// writes project_number and instance_creation_timestamp as JSON numbers and
// instance_id as a string; the identifier fields accept either form.
type computeEngine struct {
	ProjectID                 json.RawMessage `json:"project_id"`
	ProjectNumber             json.RawMessage `json:"project_number"`
	Zone                      json.RawMessage `json:"zone"`
	InstanceID                json.RawMessage `json:"instance_id"`
	InstanceName              json.RawMessage `json:"instance_name"`
	InstanceCreationTimestamp json.RawMessage `json:"instance_creation_timestamp"`
}

var errNotObject = errors.New("not a JSON object")

// unmarshalObject decodes b, which must be exactly one JSON object.
func unmarshalObject(b []byte, v any) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return errNotObject
	}
	return json.Unmarshal(b, v)
}

// googleClaims is the google member.
type googleClaims struct {
	ComputeEngine json.RawMessage `json:"compute_engine"`
}

// str reads a claim that must be a JSON string.
func str(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

// present reports whether a raw member was in the token and not null.
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// intClaim reads a NumericDate or other integer claim written as a JSON
// number. Fractions, exponents, strings and values beyond int64 are
// refused (Google writes plain integers).
func intClaim(raw json.RawMessage) (int64, bool) {
	s := string(raw)
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

// decimalID reads an identifier made of decimal digits, written either as
// a JSON number or as a JSON string, without a leading zero.
func decimalID(raw json.RawMessage) (string, bool) {
	s := string(raw)
	if len(s) >= 2 && s[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", false
		}
	}
	if s == "" || len(s) > 32 || (s[0] == '0' && len(s) > 1) {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return "", false
		}
	}
	return s, true
}

// audience reads aud: one string, or an array holding exactly one string
// (RFC 7519 allows both; Google writes a string). An array of several
// audiences is refused: a token meant for several parties is not ours.
func audience(raw json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true
	}
	var l []string
	if err := json.Unmarshal(raw, &l); err == nil && len(l) == 1 {
		return l[0], true
	}
	return "", false
}

// isLabel reports whether s is an RFC 1035 label, the form of a Compute
// Engine instance name and zone: a lowercase letter, then letters, digits
// and hyphens, not ending in a hyphen, at most 63 characters. Kubernetes
// accepts it as a node name unchanged.
func isLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] < 'a' || s[0] > 'z' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// isProjectID reports whether s has the form of a project ID: lowercase
// letters, digits and hyphens, optionally after a "domain.tld:" prefix
// (legacy domain-scoped projects), at most maxClaimString bytes.
func isProjectID(s string) bool {
	if len(s) == 0 || len(s) > maxClaimString {
		return false
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		if !isPrintable(s[:i]) {
			return false
		}
		s = s[i+1:]
	}
	return isLabel(s)
}

// isPrintable reports whether s is non-empty printable ASCII without
// spaces, at most maxClaimString bytes.
func isPrintable(s string) bool {
	if len(s) == 0 || len(s) > maxClaimString {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
