package systemtest_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// attackLimits are serve's default limits, with a header timeout and a
// per-source connection cap small enough for a test to reach quickly.
func attackLimits() serve.LimitConfig {
	l := serve.DefaultLimits()
	l.ReadHeaderTimeout = 2 * time.Second
	l.ConnsPerSource = 32
	return l
}

// attackEnv is a server under attack and what attackers and honest
// machines need to reach it.
type attackEnv struct {
	*server
	addr   string // host:port of the TLS port
	bundle []byte
	roots  *x509.CertPool
}

func newAttackEnv(t *testing.T) *attackEnv {
	t.Helper()
	s := startServerWith(t, nil, func(c *serve.Config) { c.Limits = attackLimits() })
	bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(bundle)
	return &attackEnv{server: s, addr: strings.TrimPrefix(s.url, "https://"), bundle: bundle, roots: roots}
}

// dialer dials from the loopback address src (each attacker and honest
// machine has its own source address).
func dialer(src string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
}

// client is an agent client whose connections come from src.
func (e *attackEnv) client(t *testing.T, src string) *agent.Client {
	t.Helper()
	c, err := agent.NewClient(e.url, e.bundle)
	if err != nil {
		t.Fatal(err)
	}
	c.HTTP.Transport.(*http.Transport).DialContext = dialer(src).DialContext
	c.MinBackoff, c.MaxBackoff = 100*time.Millisecond, time.Second
	return c
}

// tlsConn opens a TLS connection from src.
func (e *attackEnv) tlsConn(t *testing.T, src string) *tls.Conn {
	t.Helper()
	c, err := tls.DialWithDialer(dialer(src), "tcp", e.addr, &tls.Config{RootCAs: e.roots, ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatalf("TLS from %s: %v", src, err)
	}
	return c
}

// answer is one response as the attack table shows it.
type answer struct {
	status int
	reason attest.Reason
	body   string
}

func (a answer) String() string {
	if a.reason != "" {
		return fmt.Sprintf("%d %s", a.status, a.reason)
	}
	return fmt.Sprint(a.status)
}

// raw sends raw bytes over a new TLS connection from src and reads every
// answer until the server closes the connection or goes quiet.
func (e *attackEnv) raw(t *testing.T, src, raw string) (answers []answer, closed bool) {
	t.Helper()
	c := e.tlsConn(t, src)
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		// The server may refuse before reading everything (431).
		t.Logf("write: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			return answers, !errors.As(err, &ne) || !ne.Timeout()
		}
		answers = append(answers, readAnswer(resp))
	}
}

func readAnswer(resp *http.Response) answer {
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	a := answer{status: resp.StatusCode, body: string(b)}
	var ref api.Refusal
	if resp.StatusCode >= 400 && json.Unmarshal(b, &ref) == nil {
		a.reason = ref.Reason
	}
	return a
}

// fullConfigMarker is in every full config and in no public tier: the
// kubelet's bootstrap kubeconfig.
const fullConfigMarker = "/etc/kubernetes/kubeconfig"

// TestAttacksOnServer runs the network attacks of the threat model against
// `nodeproof serve` with its default limits: path tricks, oversized
// headers, slowloris, a junk flood and a connection flood from one address
// (honest machines on other addresses attest meanwhile), a quote relayed
// into another session, replayed tokens, and stolen cloud documents.
// Every row goes into the attack table (make attacks).
func TestAttacksOnServer(t *testing.T) {
	e := newAttackEnv(t)
	t.Run("paths", func(t *testing.T) { testPathTricks(t, e) })
	t.Run("headers", func(t *testing.T) { testOversizedHeaders(t, e) })
	t.Run("slowloris", func(t *testing.T) { testSlowloris(t, e) })
	t.Run("flood", func(t *testing.T) { testJunkFlood(t, e) })
	t.Run("relay and replay", func(t *testing.T) { testRelayAndReplay(t, e) })
	t.Run("cloud", func(t *testing.T) { testStolenCloudEvidence(t, e) })
}

func testPathTricks(t *testing.T, e *attackEnv) {
	cases := []struct{ attack, target, want string }{
		{"dot-dot through the public tier to another pool", "/config/../config/master", "400 BadPath"},
		{"encoded dot-dot", "/config/%2e%2e/config/master", "400 BadPath"},
		{"encoded slash", "/config%2Fmaster", "400 BadPath"},
		{"encoded slash inside the pool name", "/config/worker%2F..%2Fmaster", "400 BadPath"},
		{"double slash", "//config/master", "400 BadPath"},
		{"dot segment", "/config/./master", "400 BadPath"},
		{"trailing dot-dot", "/config/worker/..", "400 BadPath"},
		{"NUL in the pool name", "/config/master%00", "400 BadPath"},
		{"upper case pool name", "/config/MASTER", "400 BadPath"},
		{"backslash", `/config\..\master`, "400 BadPath"},
		{"absolute-form request line for a pool that needs credentials", "http://evil.example/config/master", "401 CredentialsRequired"},
		{"empty token parameter", "/config/master?token=", "401 CredentialsRequired"},
		{"path tricks in the token parameter", "/config/master?token=../../etc/shadow", "403 TokenInvalid"},
	}
	for _, tc := range cases {
		answers, _ := e.raw(t, "127.0.0.2", "GET "+tc.target+" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
		got := "no answer"
		if len(answers) > 0 {
			got = answers[0].String()
			if strings.Contains(answers[0].body, fullConfigMarker) {
				got += " WITH THE FULL CONFIG"
			}
		}
		attacktable.Check(t, "MCS paths", tc.attack+": GET "+tc.target, tc.want, got)
	}
}

func testOversizedHeaders(t *testing.T, e *attackEnv) {
	for _, tc := range []struct {
		attack string
		header string
	}{
		{"one 64 KiB header", "X-Pad: " + strings.Repeat("a", 64<<10) + "\r\n"},
		{"5,000 small headers (40 KB)", strings.Repeat("X-A: b\r\n", 5000)},
	} {
		answers, closed := e.raw(t, "127.0.0.2", "GET /config/worker HTTP/1.1\r\nHost: 127.0.0.1\r\n"+tc.header+"\r\n")
		got := fmt.Sprint(len(answers), " answers")
		if len(answers) == 1 {
			got = fmt.Sprintf("%s, closed=%v", answers[0], closed)
		}
		attacktable.Check(t, "MCS HTTP", tc.attack, "431, closed=true", got)
	}
}

// testSlowloris: one address opens more connections than its cap and
// trickles headers (or never finishes the TLS handshake); the server holds
// at most the cap, closes each within its header timeout, and serves
// another address meanwhile.
func testSlowloris(t *testing.T, e *attackEnv) {
	const src, n = "127.0.0.3", 48 // cap 32
	limits := attackLimits()
	type result struct {
		refusedAtOnce bool
		heldFor       time.Duration
	}
	results := make([]result, n)
	// Refused at accept: closed well before the header timeout could
	// have closed it. Half the timeout, not a fixed few milliseconds: on
	// a busy machine a refused connection's close can take a while to
	// be seen, and a held one is never closed before the timeout.
	atOnce := limits.ReadHeaderTimeout / 2
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dialer(src).Dial("tcp", e.addr)
			if err != nil {
				results[i].refusedAtOnce = true
				return
			}
			defer c.Close()
			opened := time.Now()
			if i%2 == 0 {
				// Finish TLS, then trickle a header line a byte at a time.
				tc := tls.Client(c, &tls.Config{RootCAs: e.roots, ServerName: "127.0.0.1"})
				if err := tc.Handshake(); err != nil {
					results[i] = result{refusedAtOnce: time.Since(opened) < atOnce, heldFor: time.Since(opened)}
					return
				}
				io.WriteString(tc, "GET /config/worker HTTP/1.1\r\nHost: 127.0.0.1\r\n")
				for {
					if _, err := tc.Write([]byte("X")); err != nil {
						break
					}
					tc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
					if _, err := tc.Read(make([]byte, 1)); err != nil {
						if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
							break // closed by the server
						}
					}
					if time.Since(opened) > 4*limits.ReadHeaderTimeout {
						break
					}
				}
			} else {
				// Never start TLS: wait for the server to close.
				c.SetReadDeadline(time.Now().Add(4 * limits.ReadHeaderTimeout))
				c.Read(make([]byte, 1))
			}
			held := time.Since(opened)
			results[i] = result{refusedAtOnce: held < atOnce, heldFor: held}
		}()
	}
	// Meanwhile, an honest fetch from another address.
	time.Sleep(500 * time.Millisecond)
	honest := "served"
	if resp, err := e.client(t, "127.0.0.4").HTTP.Get(e.url + "/config/worker"); err != nil {
		honest = "not served: " + err.Error()
	} else if a := readAnswer(resp); a.status != http.StatusOK {
		honest = "not served: " + a.String()
	}
	wg.Wait()
	refused, longest := 0, time.Duration(0)
	for _, r := range results {
		if r.refusedAtOnce {
			refused++
		} else if r.heldFor > longest {
			longest = r.heldFor
		}
	}
	t.Logf("slowloris: %d of %d connections refused at accept; the rest closed by the server after at most %s (in %s)", refused, n, longest.Round(10*time.Millisecond), time.Since(start).Round(time.Millisecond))
	bounded := refused >= n-limits.ConnsPerSource && longest <= limits.ReadHeaderTimeout+time.Second
	attacktable.Check(t, "network", fmt.Sprintf("slowloris: %d connections from one address trickling headers or never finishing TLS (cap %d, header timeout %s)", n, limits.ConnsPerSource, limits.ReadHeaderTimeout),
		"the excess refused at accept, the rest closed within the header timeout", map[bool]string{true: "the excess refused at accept, the rest closed within the header timeout", false: fmt.Sprintf("%d refused at once, longest held %s", refused, longest)}[bounded])
	attacktable.Check(t, "network", "an honest fetch from another address during the slowloris", "served", honest)
}

// testJunkFlood: one address sends junk challenges as fast as it can
// (pipelined over a few TLS connections) and opens connections as fast as
// it can; honest TPM, GCP and AWS machines on other addresses attest and
// fetch meanwhile.
func testJunkFlood(t *testing.T, e *attackEnv) {
	const attacker = "127.0.0.5"
	const conns, batch = 8, 64
	junk := "POST " + api.PathChallenge + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	var req bytes.Buffer
	for range batch {
		req.WriteString(junk)
	}
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	var sent atomic.Int64
	var mu sync.Mutex
	answers := map[string]int{}
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, err := tls.DialWithDialer(dialer(attacker), "tcp", e.addr, &tls.Config{RootCAs: e.roots, ServerName: "127.0.0.1"})
				if err != nil {
					continue // refused at accept: try again
				}
				br := bufio.NewReader(c)
				for ctx.Err() == nil {
					if _, err := c.Write(req.Bytes()); err != nil {
						break
					}
					sent.Add(batch)
					local := map[string]int{}
					ok := true
					for range batch {
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							ok = false
							break
						}
						local[readAnswer(resp).String()]++
					}
					mu.Lock()
					for k, v := range local {
						answers[k] += v
					}
					mu.Unlock()
					if !ok {
						break
					}
				}
				c.Close()
			}
		}()
	}
	// A connection flood from the same address.
	var connTries atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if c, err := dialer(attacker).Dial("tcp", e.addr); err == nil {
				connTries.Add(1)
				c.Close()
			}
		}
	}()

	time.Sleep(time.Second) // the flood is on
	honest := map[string]string{}
	var hwg sync.WaitGroup
	for _, kind := range []string{"tpm", "gcp", "aws"} {
		hwg.Add(1)
		go func() {
			defer hwg.Done()
			honest[kind] = e.honestMachine(t, kind, "127.0.1."+fmt.Sprint(len(kind)+len(honest)))
		}()
	}
	hwg.Wait()
	time.Sleep(time.Second)
	cancel()
	wg.Wait()
	elapsed := time.Since(start)

	total := 0
	var kinds []string
	for k, v := range answers {
		total += v
		kinds = append(kinds, fmt.Sprintf("%s ×%d", k, v))
	}
	sort.Strings(kinds)
	t.Logf("junk flood from %s: %d requests answered in %s (%.0f/s: %s); %d connections opened by the connection flood",
		attacker, total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), strings.Join(kinds, ", "), connTries.Load())
	// The share of junk the server parsed at all is the source's bucket
	// (burst + rate × time); everything else must be RateLimited.
	limited := answers["503 RateLimited"]
	got := fmt.Sprintf("%d of %d limited", limited, total)
	if total > 0 && float64(limited) >= 0.8*float64(total) && answers["200"] == 0 {
		got = "503 RateLimited"
	}
	attacktable.Check(t, "network", fmt.Sprintf("junk challenges pipelined from one address as fast as it can send (%d answered)", total), "503 RateLimited", got)
	for _, kind := range []string{"tpm", "gcp", "aws"} {
		attacktable.Check(t, "network", "an honest "+strings.ToUpper(kind)+" machine on another address during the flood", "attested and fetched", honest[kind])
	}
	lines, counted := 0, false
	for _, l := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(l, `"reason":"RateLimited"`) && strings.Contains(l, attacker) {
			lines++
			counted = counted || strings.Contains(l, `"limitedNotLogged"`)
		}
	}
	t.Logf("the flood's %d refusals took %d log lines", limited, lines)
	quiet := "a few lines a second, the rest counted"
	if lines > 10+int(elapsed.Seconds())*2 || !counted {
		quiet = fmt.Sprintf("%d lines for %d refusals (counted: %v)", lines, limited, counted)
	}
	attacktable.Check(t, "network", "the flood turned into a flood of log lines", "a few lines a second, the rest counted", quiet)
}

// honestMachine attests with evidence of kind from src and fetches the
// full config; it returns "attested and fetched" or what went wrong.
func (e *attackEnv) honestMachine(t *testing.T, kind, src string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := e.client(t, src)
	key, err := agent.KubeletKey(filepath.Join(t.TempDir(), "kubelet.key"))
	if err != nil {
		return err.Error()
	}
	var ev agent.Evidence
	switch kind {
	case "tpm":
		m, err := e.man.NewMachine(ctx, t.TempDir(), firmwaretestdata.MustLog("rhel8-uefi"))
		if err != nil {
			return err.Error()
		}
		defer m.Close()
		ev = agent.TPMEvidence{Collector: m.Collector}
	case "gcp":
		ev = agent.GCPEvidence{Metadata: e.gce.Client()}
	case "aws":
		doc := awstest.NewDocument("us-east-1", time.Now().Add(-time.Minute))
		doc.InstanceID = fmt.Sprintf("i-0%016x", sha256.Sum256([]byte(src)))[:19]
		doc.PrivateIP = "10.0.2." + src[strings.LastIndex(src, ".")+1:] // its own node name
		files, err := e.awsRegion.Files(doc)
		if err != nil {
			return err.Error()
		}
		imds := awstest.NewIMDS(files)
		defer imds.Close()
		ev = agent.AWSEvidence{IMDS: imds.Client()}
	}
	vr, err := ev.Attest(ctx, c, "worker", "honest-"+kind, key)
	if err != nil {
		return "attest: " + err.Error()
	}
	full, err := c.FetchConfig(ctx, "worker", vr.ConfigToken)
	if err != nil {
		return "fetch: " + err.Error()
	}
	if !bytes.Contains(full, []byte(fullConfigMarker)) {
		return "fetched something else than the full config"
	}
	return "attested and fetched"
}

// testRelayAndReplay: a genuine machine's answer relayed into a session
// the attacker opened with the machine's public EK and AK; the machine's
// verify replayed after its config was delivered; its config token
// replayed, used for another pool, or sent over plain HTTP.
func testRelayAndReplay(t *testing.T, e *attackEnv) {
	ctx := context.Background()
	m, err := e.man.NewMachine(ctx, t.TempDir(), firmwaretestdata.MustLog("rhel8-uefi"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	honest := e.client(t, "127.0.0.6")
	attacker := e.client(t, "127.0.0.7")
	attackerKey, err := agent.KubeletKey(filepath.Join(t.TempDir(), "attacker.key"))
	if err != nil {
		t.Fatal(err)
	}

	// The honest exchange, recorded.
	req, err := m.Collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	var ch api.ChallengeResponse
	post(t, honest, api.PathChallenge, api.ChallengeRequest{Kind: attest.KindTPM, Pool: "worker", KubeletPublicKey: m.KubeletDER, NodeName: "genuine", Request: api.Message(req)}, &ch)
	var tc tpm.Challenge
	if err := json.Unmarshal(ch.Challenge, &tc); err != nil {
		t.Fatal(err)
	}
	ev, err := m.Collector.Answer(&tc, m.KubeletSHA)
	if err != nil {
		t.Fatal(err)
	}
	honestVerify := api.VerifyRequest{Session: ch.Session, Kind: attest.KindTPM, Evidence: api.Message(ev)}

	// The attacker's session: the genuine machine's public EK and AK (no
	// secret in them), the attacker's kubelet key.
	var ach api.ChallengeResponse
	post(t, attacker, api.PathChallenge, api.ChallengeRequest{Kind: attest.KindTPM, Pool: "worker", KubeletPublicKey: attackerKey, NodeName: "genuine", Request: api.Message(req)}, &ach)
	relayed := honestVerify
	relayed.Session = ach.Session
	attacktable.Check(t, "TPM (server)", "a genuine machine's answer relayed into the attacker's session (opened with its public EK and AK)",
		"403 "+string(attest.ReasonActivation), refusal(postRaw(t, attacker, api.PathVerify, relayed)))

	var vr api.VerifyResponse
	post(t, honest, api.PathVerify, honestVerify, &vr)
	if _, err := honest.FetchConfig(ctx, "worker", vr.ConfigToken); err != nil {
		t.Fatalf("the genuine machine's fetch: %v", err)
	}
	attacktable.Check(t, "TPM (server)", "the genuine machine's verify replayed after its config was delivered",
		"403 "+string(attest.ReasonSessionReused), refusal(postRaw(t, attacker, api.PathVerify, honestVerify)))
	attacktable.Check(t, "MCS tokens", "a config token replayed after its config was delivered",
		"403 "+string(attest.ReasonTokenUsed), fetchRefusal(attacker.FetchConfig(ctx, "worker", vr.ConfigToken)))
	attacktable.Check(t, "MCS tokens", "a config token for one pool used for another",
		"403 "+string(attest.ReasonTokenWrongPool), fetchRefusal(attacker.FetchConfig(ctx, "master", vr.ConfigToken)))
	attacktable.Check(t, "MCS tokens", "a forged config token",
		"403 "+string(attest.ReasonTokenInvalid), fetchRefusal(attacker.FetchConfig(ctx, "worker", "np1."+strings.Repeat("A", 80))))
	attacktable.Check(t, "MCS tokens", "a made-up provisioning token",
		"403 "+string(attest.ReasonTokenInvalid), fetchRefusal(attacker.FetchConfig(ctx, "master", "not-the-token")))
}

// testStolenCloudEvidence: a GCP token minted for one session used in
// another or replayed; an AWS document stolen from an enrolled instance
// used from another host; a stolen document used before its instance
// enrolled (the residual risk the AWS document's lack of a nonce leaves).
func testStolenCloudEvidence(t *testing.T, e *attackEnv) {
	ctx := context.Background()
	keyDir := t.TempDir()
	key, err := agent.KubeletKey(filepath.Join(keyDir, "kubelet.key"))
	if err != nil {
		t.Fatal(err)
	}
	victim, thief := e.client(t, "127.0.0.8"), e.client(t, "127.0.0.9")

	// GCP: the victim's token for its session, used in the thief's. The
	// victim is an instance of its own (an instance enrols once, and the
	// flood's honest machine was the default one).
	inst := gcptest.DefaultInstance(time.Now())
	inst.InstanceName, inst.InstanceID = "victim-0", "4567890123456789099"
	e.gce.SetInstance(inst)
	var vch, tch api.ChallengeResponse
	post(t, victim, api.PathChallenge, api.ChallengeRequest{Kind: attest.KindGCP, Pool: "worker", KubeletPublicKey: key, Request: api.Message(&gcp.ChallengeRequest{})}, &vch)
	post(t, thief, api.PathChallenge, api.ChallengeRequest{Kind: attest.KindGCP, Pool: "worker", KubeletPublicKey: key, Request: api.Message(&gcp.ChallengeRequest{})}, &tch)
	var gch gcp.Challenge
	if err := json.Unmarshal(vch.Challenge, &gch); err != nil {
		t.Fatal(err)
	}
	token := e.gce.Mint(t, gch.Audience)
	attacktable.Check(t, "GCP (server)", "an identity token minted for another session, replayed in the thief's",
		"403 "+string(attest.ReasonTokenAudience), refusal(postRaw(t, thief, api.PathVerify, api.VerifyRequest{Session: tch.Session, Kind: attest.KindGCP, Evidence: api.Message(&gcp.Evidence{Token: token})})))
	var vr api.VerifyResponse
	post(t, victim, api.PathVerify, api.VerifyRequest{Session: vch.Session, Kind: attest.KindGCP, Evidence: api.Message(&gcp.Evidence{Token: token})}, &vr)
	if _, err := victim.FetchConfig(ctx, "worker", vr.ConfigToken); err != nil {
		t.Fatalf("the victim's fetch: %v", err)
	}
	attacktable.Check(t, "GCP (server)", "an identity token replayed with its own session after the config was delivered",
		"403 "+string(attest.ReasonSessionReused), refusal(postRaw(t, thief, api.PathVerify, api.VerifyRequest{Session: vch.Session, Kind: attest.KindGCP, Evidence: api.Message(&gcp.Evidence{Token: token})})))

	// AWS: the victim enrols; the thief uses the same document from
	// another host.
	doc := awstest.NewDocument("us-east-1", time.Now().Add(-2*time.Minute))
	doc.InstanceID, doc.PrivateIP = "i-0a1b2c3d4e5f60001", "10.0.3.1"
	files, err := e.awsRegion.Files(doc)
	if err != nil {
		t.Fatal(err)
	}
	imds := awstest.NewIMDS(files)
	defer imds.Close()
	if _, err := (agent.AWSEvidence{IMDS: imds.Client()}).Attest(ctx, victim, "worker", "", key); err != nil {
		t.Fatalf("the victim's enrolment: %v", err)
	}
	_, err = agent.AWSEvidence{IMDS: imds.Client()}.Attest(ctx, thief, "worker", "", key)
	attacktable.Check(t, "AWS (server)", "an identity document stolen from an enrolled instance, used from another host",
		"403 "+string(attest.ReasonIdentityEnrolled), fetchRefusal(nil, err))

	// Enrolling again needs proof of the kubelet key the enrolment bound:
	// the instance itself can (after a crash cost it its config token), a
	// thief with the document and the public key cannot.
	ev, err := aws.Collect(ctx, imds.Client())
	if err != nil {
		t.Fatal(err)
	}
	victimKey := ecKey(t, filepath.Join(keyDir, "kubelet.key"))
	thiefKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	enrolAgain := func(c *agent.Client, signer crypto.Signer) string {
		var ch api.ChallengeResponse
		post(t, c, api.PathChallenge, api.ChallengeRequest{Kind: attest.KindAWS, Pool: "worker", KubeletPublicKey: key, Request: api.Message(&aws.ChallengeRequest{})}, &ch)
		req := api.VerifyRequest{Session: ch.Session, Kind: attest.KindAWS, Evidence: api.Message(ev)}
		if signer != nil {
			if req.KubeletKeyProof, err = attest.SignKeyProof(signer, ch.Session); err != nil {
				t.Fatal(err)
			}
		}
		return postRaw(t, c, api.PathVerify, req).String()
	}
	attacktable.Check(t, "AWS (server)", "a stolen document with the enrolled kubelet public key bound, no proof of the private key",
		"403 "+string(attest.ReasonIdentityEnrolled), enrolAgain(thief, nil))
	attacktable.Check(t, "AWS (server)", "a stolen document with the enrolled kubelet public key bound, a proof made with another key",
		"403 "+string(attest.ReasonKeyProof), enrolAgain(thief, thiefKey))
	if got := enrolAgain(victim, victimKey); got != "200" {
		t.Fatalf("the instance enrolling again with proof of its kubelet key: %s", got)
	}

	// The residual risk, shown rather than hidden: a document stolen before
	// its instance enrolled is accepted once (the age window and the EC2
	// live check narrow it; TPM evidence on NitroTPM closes it).
	doc2 := awstest.NewDocument("us-east-1", time.Now().Add(-2*time.Minute))
	doc2.InstanceID, doc2.PrivateIP = "i-0a1b2c3d4e5f60002", "10.0.3.2"
	files2, err := e.awsRegion.Files(doc2)
	if err != nil {
		t.Fatal(err)
	}
	imds2 := awstest.NewIMDS(files2)
	defer imds2.Close()
	_, err = agent.AWSEvidence{IMDS: imds2.Client()}.Attest(ctx, thief, "worker", "", key)
	got := "accepted once (documented residual risk)"
	if err != nil {
		got = err.Error()
	}
	attacktable.Check(t, "AWS (server)", "a document stolen before its instance enrolled, used first from another host", "accepted once (documented residual risk)", got)
	_, err = agent.AWSEvidence{IMDS: imds2.Client()}.Attest(ctx, victim, "worker", "", key)
	attacktable.Check(t, "AWS (server)", "... the genuine instance then (sees the theft as a refusal on its console)",
		"403 "+string(attest.ReasonIdentityEnrolled), fetchRefusal(nil, err))
}

// post sends v to path and decodes a 200 answer into out, failing the test
// otherwise.
func post(t *testing.T, c *agent.Client, path string, v, out any) {
	t.Helper()
	a := postRaw(t, c, path, v)
	if a.status != http.StatusOK {
		t.Fatalf("%s: %s %s", path, a, a.body)
	}
	if err := json.Unmarshal([]byte(a.body), out); err != nil {
		t.Fatal(err)
	}
}

// postRaw sends v to path once (no retries) and returns the answer.
func postRaw(t *testing.T, c *agent.Client, path string, v any) answer {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.HTTP.Post(c.BaseURL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return readAnswer(resp)
}

func refusal(a answer) string { return a.String() }

// fetchRefusal is the status and reason of a refused agent call, or what
// else happened.
func fetchRefusal(_ []byte, err error) string {
	var r *agent.Refused
	switch {
	case err == nil:
		return "accepted"
	case errors.As(err, &r):
		return fmt.Sprintf("%d %s", r.Status, r.Refusal.Reason)
	}
	return err.Error()
}

// ecKey reads the EC private key the agent wrote to path.
func ecKey(t *testing.T, path string) *ecdsa.PrivateKey {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM", path)
	}
	k, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
