package userdata_test

import (
	"bytes"
	"encoding/base64"
	"testing"
	"time"

	ignconfig "github.com/coreos/ignition/v2/config"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/pointer"
	"github.com/nodeproof/nodeproof/mcs/userdata"
)

// FuzzPatch: whatever an installer's <role>-user-data holds, Patch either
// refuses it or returns an Ignition config that parses, trusts exactly the
// new bundle, carries the new token only where a token was, and is left
// alone by a second Patch.
func FuzzPatch(f *testing.F) {
	fs, _, err := certs.Next(nil, func(n string) string { return n }, "", certs.Options{Clock: time.Now, Hosts: []string{"a.example.com"}})
	if err != nil {
		f.Fatal(err)
	}
	ca := fs[certs.CABundleFileName]
	for _, o := range []pointer.Options{
		{URL: "https://api-int.example.com:22623/config/worker", CABundle: ca, Token: "old"},
		{URL: "https://api-int.example.com:22623/config/worker", CABundle: ca, Token: "old", TokenInURL: true, Version: "3.4.0"},
		{URL: "https://api-int.example.com:22623/config/master", CABundle: ca},
	} {
		b, err := pointer.Build(o)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "new")
	}
	f.Add([]byte(`{"ignition":{"version":"3.2.0","config":{"replace":{"source":"https://x/config/w?token=a"}}}}`), "t")
	f.Add([]byte(`{"ignition":{"version":"2.2.0"}}`), "")
	f.Fuzz(func(t *testing.T, raw []byte, token string) {
		out, changed, err := userdata.Patch(raw, ca, token)
		if err != nil {
			return
		}
		if !changed {
			if !bytes.Equal(out, raw) {
				t.Fatal("unchanged, but other bytes returned")
			}
			return
		}
		if _, _, err := ignconfig.Parse(out); err != nil {
			t.Fatalf("the patched config does not parse: %v", err)
		}
		if !bytes.Contains(out, []byte(base64.StdEncoding.EncodeToString(ca))) {
			t.Fatal("the patched config does not carry the bundle")
		}
		again, changed2, err := userdata.Patch(out, ca, token)
		if err != nil || changed2 || !bytes.Equal(again, out) {
			t.Fatalf("a second patch changed it again (%v, %v)", changed2, err)
		}
	})
}
