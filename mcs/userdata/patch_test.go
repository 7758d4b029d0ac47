package userdata_test

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/pointer"
	"github.com/nodeproof/nodeproof/mcs/userdata"
)

func TestPatch(t *testing.T) {
	bundle := func(host string) []byte {
		f, _, err := certs.Next(nil, func(n string) string { return n }, "", certs.Options{Clock: time.Now, Hosts: []string{host}})
		if err != nil {
			t.Fatal(err)
		}
		return f[certs.CABundleFileName]
	}
	oldCA, newCA := bundle("a.example.com"), bundle("b.example.com")
	build := func(tok string, inURL bool, ver string) []byte {
		b, err := pointer.Build(pointer.Options{URL: "https://api-int.example.com:22623/config/worker", CABundle: oldCA, Token: tok, TokenInURL: inURL, Version: ver})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name        string
		in          []byte
		token       string
		wantChanged bool
		wantToken   string // in the result; "" none
		wantErr     string
	}{
		{"header token replaced", build("old-token", false, "3.2.0"), "new-token", true, "Bearer new-token", ""},
		{"URL token replaced", build("old-token", true, "3.4.0"), "new-token", true, "token=new-token", ""},
		{"no token stays without one", build("", false, "3.2.0"), "new-token", true, "", ""},
		{"token kept when the pool takes none", build("old-token", false, "3.2.0"), "", true, "Bearer old-token", ""},
		{"not Ignition", []byte(`{"hello":1}`), "", false, "", "does not parse"},
		{"spec 2", []byte(`{"ignition":{"version":"2.2.0"}}`), "", false, "", "does not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed, err := userdata.Patch(tc.in, newCA, tc.token)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || changed != tc.wantChanged {
				t.Fatalf("changed %v, %v; want %v", changed, err, tc.wantChanged)
			}
			if !bytes.Contains(out, []byte(base64.StdEncoding.EncodeToString(newCA))) || bytes.Contains(out, []byte(base64.StdEncoding.EncodeToString(oldCA))) {
				t.Error("the result does not carry exactly the new bundle")
			}
			if tc.wantToken != "" && !bytes.Contains(out, []byte(tc.wantToken)) {
				t.Errorf("the result lacks %q: %s", tc.wantToken, out)
			}
			if tc.wantToken == "" && bytes.Contains(out, []byte("token")) {
				t.Errorf("a token appeared: %s", out)
			}
			if !bytes.Contains(out, []byte("/config/worker")) {
				t.Error("the source was lost")
			}
			again, changed, err := userdata.Patch(out, newCA, tc.token)
			if err != nil || changed || !bytes.Equal(again, out) {
				t.Errorf("a second patch changed it again (%v, %v)", changed, err)
			}
		})
	}
}
