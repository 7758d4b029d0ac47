package tokens

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/mcs/seal"
)

var t0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func TestProvisioningRotation(t *testing.T) {
	now := t0
	clock := func() time.Time { return now }
	path := filepath.Join(t.TempDir(), "tokens.json")
	p, err := LoadProvisioning(path, time.Hour, clock)
	if err != nil {
		t.Fatal(err)
	}
	first := p.Current()
	if raw, err := decodeLen(first); err != nil || raw != ProvisioningTokenBytes {
		t.Fatalf("token is not %d random bytes: %d %v", ProvisioningTokenBytes, raw, err)
	}
	if err := p.Rotate(); err != nil {
		t.Fatal(err)
	}
	second := p.Current()
	reloaded, err := LoadProvisioning(path, time.Hour, clock)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		at     time.Duration
		token  string
		accept bool
	}{
		{"new token", 0, second, true},
		{"previous token within grace", 59 * time.Minute, first, true},
		{"previous token after grace", 61 * time.Minute, first, false},
		{"new token after grace", 61 * time.Minute, second, true},
		{"empty", 0, "", false},
		{"prefix of the token", 0, second[:10], false},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			now = t0.Add(s.at)
			for _, pp := range []*Provisioning{p, reloaded} {
				if got := pp.Check(s.token); got != s.accept {
					t.Fatalf("Check = %v, want %v", got, s.accept)
				}
			}
		})
	}
	now = t0.Add(2 * time.Hour)
	if err := p.Rotate(); err != nil {
		t.Fatal(err)
	}
	if len(p.tokens) != 2 {
		t.Fatalf("file keeps %d tokens; the one past grace should be dropped", len(p.tokens))
	}
}

// TestProvisioningReload: a rotation by another process (the CLI) reaches
// a running server's Provisioning; a broken file changes nothing.
func TestProvisioningReload(t *testing.T) {
	clock := func() time.Time { return t0 }
	path := filepath.Join(t.TempDir(), "tokens.json")
	server, err := LoadProvisioning(path, time.Hour, clock)
	if err != nil {
		t.Fatal(err)
	}
	first := server.Current()
	if changed, err := server.Reload(); err != nil || changed {
		t.Fatalf("Reload of an unchanged file: %v %v", changed, err)
	}
	cli, err := LoadProvisioning(path, time.Hour, clock)
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Rotate(); err != nil {
		t.Fatal(err)
	}
	if changed, err := server.Reload(); err != nil || !changed {
		t.Fatalf("Reload after a rotation: %v %v", changed, err)
	}
	if server.Current() != cli.Current() || !server.Check(first) {
		t.Fatal("the server did not take the new token, or dropped the old one within grace")
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Reload(); err == nil || server.Current() != cli.Current() {
		t.Fatal("a malformed file was accepted or changed the tokens")
	}
}

func decodeLen(s string) (int, error) {
	b, err := base64Std(s)
	return len(b), err
}

func TestConfigTokens(t *testing.T) {
	k, err := seal.New([]seal.Key{{ID: make([]byte, 8), Secret: make([]byte, 32)}}, func() time.Time { return t0 })
	if err != nil {
		t.Fatal(err)
	}
	tok, err := IssueConfigToken(k, ConfigToken{ID: "j1", RecordID: "r1", NodeName: "n1", Pool: "worker", Expires: t0.Add(10 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if !IsConfigToken(tok) || IsConfigToken("c29tZXRva2Vu") {
		t.Fatal("IsConfigToken confuses the two kinds")
	}
	session, _ := k.Seal("session", []byte(`{"jti":"j1","rid":"r1","exp":"2030-01-01T00:00:00Z"}`))
	cases := []struct {
		name string
		tok  string
		at   time.Time
		want error
	}{
		{"valid", tok, t0, nil},
		{"expired", tok, t0.Add(10 * time.Minute), ErrTokenExpired},
		{"a sealed session presented as a token", session, t0, ErrTokenInvalid},
		{"garbage", "np1.AAAA", t0, ErrTokenInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ct, err := OpenConfigToken(k, tc.tok, tc.at)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if err == nil && (ct.RecordID != "r1" || ct.Pool != "worker") {
				t.Fatalf("token says %+v", ct)
			}
		})
	}
}

func base64Std(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }
