package agent

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/render"
)

// answer is a RoundTripper that answers every request with one response
// made of fuzzed parts: what a server, or anything between the node and
// it, may send back.
type answer struct {
	status     int
	retryAfter string
	body       []byte
}

func (a *answer) RoundTrip(req *http.Request) (*http.Response, error) {
	h := http.Header{}
	if a.retryAfter != "" {
		h.Set("Retry-After", a.retryAfter)
	}
	return &http.Response{StatusCode: a.status, Header: h, Body: io.NopCloser(bytes.NewReader(a.body)),
		ContentLength: int64(len(a.body)), Request: req}, nil
}

// FuzzServerAnswers feeds the agent's client the server's answers — status,
// Retry-After and body — for each request it makes: a challenge response,
// a verify response, a config. Seeds are the server's real answers and
// refusals (docs/protocol.md). Properties:
//   - 200: the answer is decoded exactly when the body is that message;
//   - 5xx: "not yet", never a *Refused, and the wait asked is between 0
//     and maxRetryAfter, whatever Retry-After says;
//   - any other status: a *Refused with that status and a reason-shaped
//     reason (the server's, "Unknown" when the body is not a refusal or
//     its reason is not a reason's shape, "Redirected" for every 3xx),
//     whose detail is bounded and free of control and format characters.
func FuzzServerAnswers(f *testing.F) {
	ch, _ := json.Marshal(api.ChallengeResponse{Session: "np1.AAAA", Expires: time.Unix(1e9, 0).UTC()})
	vr, _ := json.Marshal(api.VerifyResponse{ConfigToken: "np1.BBBB", NodeName: "worker-0", Pool: "worker", Record: "r1"})
	for kind, body := range [][]byte{ch, vr, []byte(`{"ignition":{"version":"3.5.0"}}`)} {
		f.Add(uint8(kind), uint16(200), "", body)
	}
	for _, s := range []struct {
		status uint16
		retry  string
		body   string
	}{
		{503, "5", `{"reason":"Unavailable","detail":"the server cannot answer now; retry"}` + "\n"},
		{503, "99999999999999", `{"reason":"RateLimited"}`},
		{503, "-3", ""},
		{503, "Wed, 21 Oct 2015 07:28:00 GMT", ""},
		{403, "", `{"reason":"QuoteBindingMismatch","detail":"quote's qualifying data is not this session's nonce and kubelet key"}`},
		{403, "", `{"reason":"TokenAlreadyUsed"}`},
		{401, "", `{"reason":"CredentialsRequired"}`},
		{400, "", `{}`},
		{404, "", `<html>not found</html>`},
		{302, "", ``},
	} {
		f.Add(uint8(0), s.status, s.retry, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, kind uint8, status uint16, retryAfter string, body []byte) {
		st := int(status) % 600
		if st < 100 {
			st += 100
		}
		a := &answer{status: st, retryAfter: retryAfter, body: body}
		c := &Client{BaseURL: "https://mcs.example:22623", HTTP: &http.Client{Transport: a}}
		var out, fresh any
		switch kind % 3 {
		case 0:
			out, fresh = new(api.ChallengeResponse), new(api.ChallengeResponse)
		case 1:
			out, fresh = new(api.VerifyResponse), new(api.VerifyResponse)
		default:
			out, fresh = new(json.RawMessage), new(json.RawMessage)
		}
		wait, err := c.once(context.Background(), http.MethodPost, api.PathChallenge, []byte("{}"), nil, out)
		var refused *Refused
		switch {
		case a.status == http.StatusOK:
			if want := json.Unmarshal(body, fresh); (err == nil) != (want == nil) {
				t.Fatalf("200 %q: err %v, want %v", body, err, want)
			}
		case a.status >= 500:
			if err == nil || errors.As(err, &refused) {
				t.Fatalf("%d is not 'not yet': %v", a.status, err)
			}
			if wait < 0 || wait > maxRetryAfter {
				t.Fatalf("Retry-After %q asks for %v", retryAfter, wait)
			}
		default:
			if !errors.As(err, &refused) || refused.Status != a.status || !reasonShaped(refused.Refusal.Reason) {
				t.Fatalf("%d %q: %v", a.status, body, err)
			}
			// What reaches the console is bounded and clean, and a
			// redirect is never followed.
			if d := refused.Refusal.Detail; len(d) > MaxRefusalDetail+32 || consoleIsClean("nodeproof-agent: "+d+"\n") != "" {
				t.Fatalf("detail %q", d)
			}
			if (a.status >= 300 && a.status < 400) != (refused.Refusal.Reason == attest.ReasonRedirected) {
				t.Fatalf("%d refused %s", a.status, refused.Refusal.Reason)
			}
		}
	})
}

// FuzzFirstBootFiles feeds WriteFirstBootFiles and ConfigFile full
// configs (what the server sends a node in mode 2), seeded with the full
// config rendered from deploy/examples/bootstrap. Properties: it writes
// only api.FirstBootFiles, under root, each at most maxFileSize, the
// bootstrap kubeconfig last; nothing else appears under root; ConfigFile
// never returns more than maxFileSize.
func FuzzFirstBootFiles(f *testing.F) {
	in, err := render.LoadBootstrapDir("../deploy/examples/bootstrap")
	if err != nil {
		f.Fatal(err)
	}
	kc, err := os.ReadFile("../deploy/examples/bootstrap-kubeconfig")
	if err != nil {
		f.Fatal(err)
	}
	r, err := render.NewRenderer(in, render.Options{BootstrapKubeconfig: kc})
	if err != nil {
		f.Fatal(err)
	}
	full, err := r.Config("worker", render.TierFull, render.V3_5)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(full)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(kc)
	zw.Close()
	f.Add([]byte(`{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/etc/kubernetes/kubeconfig","contents":{"compression":"gzip","source":"data:;base64,` +
		base64.StdEncoding.EncodeToString(gz.Bytes()) + `"},"mode":420},{"path":"/var/lib/kubelet/config.json","contents":{"source":"data:,%7B%7D"}}]}}`))
	f.Add([]byte(`{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/etc/kubernetes/../kubernetes/kubeconfig","contents":{"source":"data:,x"}},{"path":"/etc/kubernetes/kubeconfig","contents":{"source":"https://example.com/kc"}}]}}`))
	f.Fuzz(func(t *testing.T, cfg []byte) {
		root := t.TempDir()
		wrote, err := WriteFirstBootFiles(root, cfg)
		for i, p := range wrote {
			if !slices.Contains(api.FirstBootFiles, p) {
				t.Fatalf("wrote %s", p)
			}
			if p == kubeconfigPath && (i != len(wrote)-1 || err != nil) {
				t.Fatalf("kubeconfig written before the other files (%v, %v)", wrote, err)
			}
		}
		werr := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			if !slices.Contains(wrote, "/"+rel) {
				return errors.New("unexpected file /" + rel)
			}
			if fi, err := d.Info(); err != nil || fi.Size() > maxFileSize || !fi.Mode().IsRegular() {
				return errors.New("file /" + rel + " of size " + strconv.FormatInt(fi.Size(), 10))
			}
			return nil
		})
		if werr != nil {
			t.Fatal(werr)
		}
		if data, err := ConfigFile(cfg, kubeconfigPath); err == nil && len(data) > maxFileSize {
			t.Fatalf("ConfigFile gave %d bytes", len(data))
		}
	})
}
