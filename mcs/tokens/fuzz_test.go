package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/mcs/seal"
)

// FuzzTokens presents arbitrary strings as bearer tokens to both checks the
// server makes: OpenConfigToken (a config token) and Provisioning.Check (a
// provisioning token). Keys and tokens are fixed, so stored corpus entries
// keep their meaning. Properties:
//   - OpenConfigToken refuses only with ErrTokenInvalid or ErrTokenExpired;
//     what it opens is exactly a token this test issued, unexpired, with
//     an ID and a record; a config token is never a valid provisioning token;
//   - Check accepts exactly the current and the rotated-out-in-grace
//     provisioning tokens, never one past its grace, a prefix, or the token
//     with anything around it;
//   - IsConfigToken is the seal prefix.
func FuzzTokens(f *testing.F) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	k, err := seal.New([]seal.Key{{ID: bytes.Repeat([]byte{1}, 8), Secret: bytes.Repeat([]byte{2}, 32), Created: now}}, clock)
	if err != nil {
		f.Fatal(err)
	}
	valid := ConfigToken{ID: "jti-1", RecordID: "rec-1", NodeName: "worker-0", Pool: "worker", Expires: now.Add(10 * time.Minute)}
	issued := map[string]ConfigToken{}
	seal1 := func(t ConfigToken) string {
		s, err := IssueConfigToken(k, t)
		if err != nil {
			f.Fatal(err)
		}
		issued[t.ID] = t
		return s
	}
	f.Add(seal1(valid))
	f.Add(seal1(ConfigToken{ID: "jti-2", RecordID: "rec-2", Pool: "worker", Expires: now.Add(-time.Second)}))
	f.Add(seal1(ConfigToken{ID: "", RecordID: "rec-3", Pool: "worker", Expires: now.Add(time.Minute)}))
	session, _ := k.Seal("attest-session", []byte(`{"jti":"jti-4","rid":"rec-4","exp":"2027-01-01T00:00:00Z"}`))
	f.Add(session)
	notJSON, _ := k.Seal(configTokenPurpose, []byte("[]"))
	f.Add(notJSON)

	path := filepath.Join(f.TempDir(), "tokens.json")
	retired, gone := now.Add(-30*time.Minute), now.Add(-2*time.Hour)
	file, _ := json.Marshal([]Token{
		{Value: "Q3VycmVudC1wcm92aXNpb25pbmctdG9rZW4tMDAwMDA=", Created: now.Add(-30 * time.Minute)},
		{Value: "UHJldmlvdXMtcHJvdmlzaW9uaW5nLXRva2VuLTAwMDA=", Created: now.Add(-3 * time.Hour), Retired: &retired},
		{Value: "R29uZS1wcm92aXNpb25pbmctdG9rZW4tMDAwMDAwMDA=", Created: now.Add(-5 * time.Hour), Retired: &gone},
	})
	if err := os.WriteFile(path, file, 0o600); err != nil {
		f.Fatal(err)
	}
	p, err := LoadProvisioning(path, time.Hour, clock)
	if err != nil {
		f.Fatal(err)
	}
	good := []string{"Q3VycmVudC1wcm92aXNpb25pbmctdG9rZW4tMDAwMDA=", "UHJldmlvdXMtcHJvdmlzaW9uaW5nLXRva2VuLTAwMDA="}
	for _, s := range append(good, "R29uZS1wcm92aXNpb25pbmctdG9rZW4tMDAwMDAwMDA=", good[0][:20], " "+good[1], "", seal.Prefix) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if IsConfigToken(s) != strings.HasPrefix(s, seal.Prefix) {
			t.Fatal("IsConfigToken is not the seal prefix")
		}
		ct, err := OpenConfigToken(k, s, now)
		if err != nil {
			if ct != nil || (!errors.Is(err, ErrTokenInvalid) && !errors.Is(err, ErrTokenExpired)) {
				t.Fatalf("refusal %v (token %v)", err, ct)
			}
		} else {
			want, ok := issued[ct.ID]
			switch {
			case !IsConfigToken(s):
				t.Fatal("opened a token without the prefix")
			case !ok || *ct != want:
				t.Fatalf("opened a token never issued: %+v", ct)
			case ct.ID == "" || ct.RecordID == "" || !now.Before(ct.Expires):
				t.Fatalf("opened an incomplete or expired token: %+v", ct)
			}
		}
		accepted := p.Check(s)
		if accepted != (s == good[0] || s == good[1]) {
			t.Fatalf("Check(%q) = %v", s, accepted)
		}
		if accepted && err == nil {
			t.Fatal("a string is both a config and a provisioning token")
		}
	})
}
