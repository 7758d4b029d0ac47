package awstest_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/identity/aws/awstest"
)

// TestIMDSv2Protocol: the fake speaks IMDSv2 as EC2's does, and nothing
// else.
func TestIMDSv2Protocol(t *testing.T) {
	files := awstest.Files{Document: []byte(`{"region":"us-east-1"}`), RSA2048: "MIAG", Signature: "c2ln"}
	m := awstest.NewIMDS(files)
	defer m.Close()

	do := func(method, path string, hdr map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, m.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if code, _ := do(http.MethodPut, "/latest/api/token", nil); code != http.StatusBadRequest {
		t.Errorf("PUT token without TTL: %d, want 400", code)
	}
	if code, _ := do(http.MethodPut, "/latest/api/token", map[string]string{awstest.TokenTTLHeader: "0"}); code != http.StatusBadRequest {
		t.Errorf("PUT token with TTL 0: %d, want 400", code)
	}
	if code, _ := do(http.MethodPut, "/latest/api/token", map[string]string{awstest.TokenTTLHeader: "21601"}); code != http.StatusBadRequest {
		t.Errorf("PUT token with TTL 21601: %d, want 400", code)
	}
	if code, _ := do(http.MethodPut, "/latest/api/token", map[string]string{awstest.TokenTTLHeader: "60", "X-Forwarded-For": "10.0.0.1"}); code != http.StatusForbidden {
		t.Errorf("PUT token through a proxy: %d, want 403", code)
	}
	if code, _ := do(http.MethodGet, "/latest/api/token", map[string]string{awstest.TokenTTLHeader: "60"}); code != http.StatusMethodNotAllowed {
		t.Errorf("GET token: %d, want 405", code)
	}
	code, tok := do(http.MethodPut, "/latest/api/token", map[string]string{awstest.TokenTTLHeader: "60"})
	if code != http.StatusOK || tok == "" {
		t.Fatalf("PUT token: %d %q", code, tok)
	}

	for path, want := range map[string]string{
		"/latest/dynamic/instance-identity/document":  string(files.Document),
		"/latest/dynamic/instance-identity/rsa2048":   files.RSA2048,
		"/latest/dynamic/instance-identity/signature": files.Signature,
	} {
		if code, _ := do(http.MethodGet, path, nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s without a token (IMDSv1): %d, want 401", path, code)
		}
		if code, _ := do(http.MethodGet, path, map[string]string{awstest.TokenHeader: "wrong"}); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %d, want 401", path, code)
		}
		code, body := do(http.MethodGet, path, map[string]string{awstest.TokenHeader: tok})
		if code != http.StatusOK || body != want {
			t.Errorf("GET %s: %d %q, want 200 %q", path, code, body, want)
		}
	}
	if code, _ := do(http.MethodGet, "/latest/meta-data/iam/security-credentials/", map[string]string{awstest.TokenHeader: tok}); code != http.StatusNotFound {
		t.Errorf("GET other path: %d, want 404", code)
	}
	if m.Gets() != 3 {
		t.Errorf("Gets() = %d, want 3", m.Gets())
	}
}

// TestEC2RequiresSignature: unsigned Query API calls are refused as EC2
// refuses them.
func TestEC2RequiresSignature(t *testing.T) {
	e := awstest.NewEC2()
	defer e.Close()
	resp, err := http.Post(e.URL, "application/x-www-form-urlencoded", strings.NewReader("Action=DescribeInstances&Version=2016-11-15"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "<Code>AuthFailure</Code>") {
		t.Fatalf("unsigned call: %d %s", resp.StatusCode, b)
	}
}
