package agent

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"strings"
	"testing"
)

func TestConfigFile(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped kubeconfig"))
	zw.Close()
	config := `{"ignition":{"version":"3.6.0-experimental"},"storage":{"files":[
	  {"path":"/etc/kubernetes/kubeconfig","contents":{"source":"data:,plain%20kubeconfig"}},
	  {"path":"/etc/zipped","contents":{"compression":"gzip","source":"data:;base64,` + base64.StdEncoding.EncodeToString(gz.Bytes()) + `"}},
	  {"path":"/etc/remote","contents":{"source":"https://example.com/x"}},
	  {"path":"/etc/empty"}]}}`
	cases := []struct {
		name, path, want, wantErr string
	}{
		{"plain data URL", "/etc/kubernetes/kubeconfig", "plain kubeconfig", ""},
		{"gzip", "/etc/zipped", "zipped kubeconfig", ""},
		{"not a data URL", "/etc/remote", "", "only data: URLs"},
		{"no contents", "/etc/empty", "", "has no file"},
		{"absent", "/etc/nothing", "", "has no file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ConfigFile([]byte(config), tc.path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("%q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := ConfigFile([]byte("not json"), "/x"); err == nil {
		t.Fatal("not JSON accepted")
	}
}
