package cluster

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodeproof/nodeproof/mcs/pointer"
)

// FuzzTokenSecret: whatever the Secret machineconfig-auth holds, its
// tokens are refused or read as a list whose current token is the "token"
// key's (trimmed), every token printable and bounded.
func FuzzTokenSecret(f *testing.F) {
	f.Add([]byte("c2VlZA==\n"), []byte(`[{"value":"c2VlZA==","created":"2026-01-01T00:00:00Z"}]`), true)
	f.Add([]byte("bmV3"), []byte(`[{"value":"b2xk","created":"2026-01-01T00:00:00Z"}]`), true)
	f.Add([]byte("x"), []byte(`{`), true)
	f.Add([]byte(""), []byte(nil), false)
	f.Fuzz(func(t *testing.T, tok, hist []byte, withHist bool) {
		ts := &TokenSecret{}
		sec := &corev1.Secret{Data: map[string][]byte{TokenKey: tok}}
		if withHist {
			sec.Data[TokenHistoryKey] = hist
		}
		list, err := ts.parse(sec)
		if err != nil {
			return
		}
		if len(list) == 0 || list[0].Value != strings.TrimSpace(string(tok)) || list[0].Retired != nil {
			t.Fatalf("current token %+v, want the token key's %q, not retired", list, tok)
		}
		for _, tk := range list {
			if pointer.CheckToken(tk.Value) != nil {
				t.Fatalf("a token that is not printable or bounded was read: %q", tk.Value)
			}
		}
	})
}
