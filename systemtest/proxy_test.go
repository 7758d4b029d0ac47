package systemtest_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// The haproxy in front of the server connects from this address, the
// only one --proxy-protocol-from trusts; machines connect from others.
const haproxySource = "127.0.0.2"

// haproxyConfig is a bare-metal install's balancer (docs/operations.md):
// TCP mode, the secure port with send-proxy-v2, the plain one with
// send-proxy (v1).
const haproxyConfig = `global
  maxconn 4096
defaults
  mode tcp
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend mcs_secure
  bind 127.0.0.1:%d
  default_backend mcs_secure
backend mcs_secure
  server mcs %s check inter 200ms send-proxy-v2 source %s
frontend mcs_insecure
  bind 127.0.0.1:%d
  default_backend mcs_insecure
backend mcs_insecure
  server mcs %s check inter 200ms send-proxy source %s
`

// startHAProxy runs the Debian haproxy in the foreground in front of the
// server's two ports and returns its frontends.
func startHAProxy(t *testing.T, secure, insecure string) (secureFront, insecureFront string) {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/haproxy"); serr != nil {
			t.Fatalf("haproxy is not installed: apt-get install -y haproxy (make test does this, hack/deps.sh): %v", err)
		}
		bin = "/usr/sbin/haproxy"
	}
	ps, pi := testenv.FreePort(t), testenv.FreePort(t)
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, haproxyConfig, ps, secure, haproxySource, pi, insecure, haproxySource), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", cfg)
	var out testenv.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("haproxy:\n%s", out.String())
		}
	})
	secureFront, insecureFront = fmt.Sprintf("127.0.0.1:%d", ps), fmt.Sprintf("127.0.0.1:%d", pi)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c1, err1 := net.Dial("tcp", secureFront)
		c2, err2 := net.Dial("tcp", insecureFront)
		if err1 == nil && err2 == nil {
			c1.Close()
			c2.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy did not listen: %v %v\n%s", err1, err2, out.String())
		}
	}
}

// behindHAProxy is serve, both ports behind the PROXY protocol from
// haproxySource, with a real haproxy in front of them.
type behindHAProxy struct {
	*server
	secure, insecure           string // the server's ports
	secureFront, insecureFront string // haproxy's
	bundle                     []byte // the CA bundle machines trust
}

func startBehindHAProxy(t *testing.T, limits serve.LimitConfig) *behindHAProxy {
	t.Helper()
	insecurePort := testenv.FreePort(t)
	s := startServerWith(t, nil, func(c *serve.Config) {
		c.Limits = limits
		c.InsecurePort = insecurePort
		c.ProxyProtocolFrom = []netip.Prefix{netip.MustParsePrefix(haproxySource + "/32")}
	})
	h := &behindHAProxy{server: s, secure: strings.TrimPrefix(s.url, "https://"), insecure: fmt.Sprintf("127.0.0.1:%d", insecurePort)}
	h.secureFront, h.insecureFront = startHAProxy(t, h.secure, h.insecure)
	var err error
	if h.bundle, err = os.ReadFile(filepath.Join(s.stateDir, "certs", "current", "ca-bundle.crt")); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestProxyProtocolAttacksBehindHAProxy: a real haproxy forwards machines to the
// server with PROXY protocol v2 (secure port) and v1 (plain port). Each
// machine gets its own limit bucket and its own address in the logs; a
// forged header sent directly, and a headerless connection from the
// balancer's address, are refused.
func TestProxyProtocolAttacksBehindHAProxy(t *testing.T) {
	limits := attackLimits()
	limits.ConfigPerSource = "0.2/3" // three fetches, then one per 5 s
	h := startBehindHAProxy(t, limits)
	s, secureAddr, insecureAddr, secureFront, insecureFront := h.server, h.secure, h.insecure, h.secureFront, h.insecureFront
	e := &attackEnv{server: s, addr: secureAddr, bundle: h.bundle}

	fetch := func(src, addr string, tlsOn bool) string { return fetchWorker(t, e.bundle, src, addr, tlsOn) }

	// Ten machines through the one haproxy, three fetches each (their
	// burst): every one is served. Without the header they would share
	// haproxy's single bucket of three.
	var served, refused int
	for m := range 10 {
		src := fmt.Sprintf("127.0.0.%d", 10+m)
		for i := range 3 {
			front, tlsOn := insecureFront, false
			if i == 1 {
				front, tlsOn = secureFront, true
			}
			if got := fetch(src, front, tlsOn); got == "200" {
				served++
			} else {
				refused++
				t.Logf("%s through haproxy (tls %v): %s", src, tlsOn, got)
			}
		}
	}
	attacktable.Check(t, "PROXY protocol", "ten machines through one haproxy, each at its own per-source burst (30 fetches, v1 and v2 headers)",
		"30 served, 0 refused", fmt.Sprintf("%d served, %d refused", served, refused))
	// One machine past its burst is limited: the buckets are per machine.
	got := fetch("127.0.0.10", insecureFront, false)
	attacktable.Check(t, "PROXY protocol", "a machine through haproxy past its own burst", "503 RateLimited", got)

	// The logs name the machines, never the balancer.
	remotes := map[string]int{}
	for _, line := range strings.Split(s.log.String(), "\n") {
		var l struct{ Msg, Remote, Path string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "request" && l.Path == "/config/worker" {
			host, _, _ := net.SplitHostPort(l.Remote)
			remotes[host]++
		}
	}
	if remotes[haproxySource] != 0 || remotes["127.0.0.10"] != 4 || remotes["127.0.0.19"] != 3 {
		t.Errorf("requests logged by remote address %v; want each machine's own (4 from 127.0.0.10, 3 from the others), none from haproxy", remotes)
	}

	// Attacks straight at the server's ports.
	direct := func(src, addr string, payload []byte) string {
		c, err := dialer(src).Dial("tcp", addr)
		if err != nil {
			return "dial failed"
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(payload); err != nil {
			return "connection closed"
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "connection closed"
		}
		return strings.TrimSpace(line)
	}
	request := "GET /config/worker HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/vnd.coreos.ignition+json;version=3.5.0\r\nConnection: close\r\n\r\n"
	forged := func(v byte) []byte {
		h := proxyHeader(t, v, "192.0.2.77")
		return append(h, request...)
	}
	attacktable.Check(t, "PROXY protocol", "a machine sends its own PROXY v1 header straight to the plain port (a fresh address: a new limit bucket, a false log)",
		"connection closed", direct("127.0.0.66", insecureAddr, forged(1)))
	attacktable.Check(t, "PROXY protocol", "a machine sends its own PROXY v2 header straight to the plain port",
		"connection closed", direct("127.0.0.66", insecureAddr, forged(2)))
	attacktable.Check(t, "PROXY protocol", "a PROXY header before the TLS handshake, straight to the secure port, from outside the trusted CIDRs",
		"connection closed", direct("127.0.0.66", secureAddr, forged(2)))
	attacktable.Check(t, "PROXY protocol", "a connection from the balancer's address without a header (its machines' addresses lost)",
		"connection closed", direct(haproxySource, insecureAddr, []byte(request)))
	// A machine that reaches the server directly, without a header, is
	// served as itself (in-cluster clients, a second path).
	attacktable.Check(t, "PROXY protocol", "a machine straight to the plain port without a header",
		"HTTP/1.1 200 OK", direct("127.0.0.67", insecureAddr, []byte(request)))

	// Each refusal is logged with its reason (after the close the client
	// saw).
	var reasons map[attest.Reason]int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		reasons = map[attest.Reason]int{}
		for _, line := range strings.Split(s.log.String(), "\n") {
			var l struct {
				Msg, Remote string
				Reason      attest.Reason
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "connection refused" {
				reasons[l.Reason]++
			}
		}
		if reasons[attest.ReasonProxyHeaderUntrusted] >= 3 && reasons[attest.ReasonProxyHeaderMissing] >= 1 || time.Now().After(deadline) {
			break
		}
	}
	if reasons[attest.ReasonProxyHeaderUntrusted] != 3 || reasons[attest.ReasonProxyHeaderMissing] != 1 {
		t.Errorf("refused connections logged by reason %v; want 3 %s and 1 %s", reasons, attest.ReasonProxyHeaderUntrusted, attest.ReasonProxyHeaderMissing)
	}
}

// fetchWorker GETs the worker config from src through addr (TLS when
// tlsOn, trusting bundle) on a connection of its own and returns "200" or
// the status and refusal reason.
func fetchWorker(t *testing.T, bundle []byte, src, addr string, tlsOn bool) string {
	t.Helper()
	tr := &http.Transport{DialContext: dialer(src).DialContext, DisableKeepAlives: true}
	scheme := "http"
	if tlsOn {
		scheme = "https"
		tr.TLSClientConfig = &tls.Config{RootCAs: rootsOf(t, bundle), ServerName: "127.0.0.1"}
	}
	req, _ := http.NewRequest("GET", scheme+"://"+addr+"/config/worker", nil)
	req.Header.Set("Accept", "application/vnd.coreos.ignition+json;version=3.5.0")
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return "connection refused or closed"
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode == http.StatusOK {
		return "200"
	}
	var r struct{ Reason string }
	json.Unmarshal(body, &r)
	return fmt.Sprintf("%d %s", resp.StatusCode, r.Reason)
}

// TestProxyHeaderQueueAttack: unlisted sources hold idle connections open
// to a server behind a real haproxy — 16 addresses with 64 each to the
// secure port, then 1,024 addresses with one each to both ports — and machines through the
// balancer and machines connecting directly are still served, each within
// 1 s: an unlisted connection never waits in the PROXY-header queue (it is
// handed to the per-source limits at once, which close an address's
// connections past --limit-conns-per-source before reading a byte), so
// the listed balancer's capacity stays its own. (On a busy 2-core machine
// a fetch through haproxy under this load takes tens of milliseconds.)
func TestProxyHeaderQueueAttack(t *testing.T) {
	limits := attackLimits()               // 32 connections per source
	limits.ReadHeaderTimeout = time.Minute // the idle connections stay for the whole test
	h := startBehindHAProxy(t, limits)
	s, secureAddr, insecureAddr, secureFront, insecureFront, bundle := h.server, h.secure, h.insecure, h.secureFront, h.insecureFront, h.bundle

	var idle []net.Conn
	t.Cleanup(func() {
		for _, c := range idle {
			c.Close()
		}
	})
	// hold opens a silent connection from src to addr.
	hold := func(src, addr string) {
		c, err := dialer(src).Dial("tcp", addr)
		if err != nil {
			t.Fatalf("an attacker's connection from %s: %v", src, err)
		}
		idle = append(idle, c)
	}
	// open counts the attackers' connections the server still holds
	// (a read that times out; a closed one reads EOF or a reset).
	open := func() int {
		n := 0
		for _, c := range idle {
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			var ne net.Error
			if _, err := c.Read(make([]byte, 1)); errors.As(err, &ne) && ne.Timeout() {
				n++
			}
		}
		return n
	}
	// served fetches through the balancer (both ports) and directly
	// (both ports) and says "served within 1 s" or what went wrong; the
	// slowest fetch is logged.
	served := func(round string) string {
		var slowest time.Duration
		for i, try := range []struct {
			src, addr string
			tls       bool
		}{
			{"127.0.0.10", secureFront, true}, {"127.0.0.11", insecureFront, false},
			{"127.0.0.70", secureAddr, true}, {"127.0.0.71", insecureAddr, false},
			{"127.0.0.12", secureFront, true}, {"127.0.0.72", secureAddr, true},
		} {
			start := time.Now()
			got := fetchWorker(t, bundle, try.src, try.addr, try.tls)
			d := time.Since(start)
			slowest = max(slowest, d)
			if got != "200" {
				return fmt.Sprintf("fetch %d (%s to %s): %s", i, try.src, try.addr, got)
			}
		}
		t.Logf("%s: slowest of six fetches (through haproxy and direct, both ports): %s", round, slowest)
		if slowest > time.Second {
			return fmt.Sprintf("served, the slowest after %s", slowest)
		}
		return "served within 1 s"
	}

	// 16 addresses, 64 idle connections each to the secure port: the
	// per-source limit (32 per port) closes each address's last 32 at
	// accept.
	for a := range 16 {
		for range 64 {
			hold(fmt.Sprintf("127.0.1.%d", a+1), secureAddr)
		}
	}
	time.Sleep(200 * time.Millisecond) // the server accepts (and closes) them
	if n := open(); n != 16*32 {
		t.Errorf("the server holds %d of the 16 × 64 idle connections; want 16 × 32 (--limit-conns-per-source)", n)
	}
	attacktable.Check(t, "PROXY protocol", "16 unlisted addresses hold 64 idle connections each: machines through haproxy and machines connecting directly fetch",
		"served within 1 s", served("16 × 64 idle"))

	// 1,024 more addresses, one idle connection each.
	for i := range 1024 {
		addr := secureAddr
		if i%2 == 1 {
			addr = insecureAddr
		}
		hold(fmt.Sprintf("127.2.%d.%d", i/256, i%256+1), addr)
	}
	time.Sleep(200 * time.Millisecond)
	if n := open(); n != 16*32+1024 {
		t.Errorf("the server holds %d idle connections; want %d", n, 16*32+1024)
	}
	attacktable.Check(t, "PROXY protocol", "1,024 more unlisted addresses hold an idle connection each: machines through haproxy and directly fetch",
		"served within 1 s", served("and 1,024 idle from many addresses"))
	if strings.Contains(s.log.String(), string(attest.ReasonProxyQueueFull)) {
		t.Errorf("a connection was refused %s", attest.ReasonProxyQueueFull)
	}
}

// proxyHeader is a PROXY protocol header (version 1 or 2) for a TCP
// connection from client.
func proxyHeader(t *testing.T, version byte, client string) []byte {
	t.Helper()
	h := proxyproto.HeaderProxyFromAddrs(version, &net.TCPAddr{IP: net.ParseIP(client), Port: 40000}, &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 22623})
	b, err := h.Format()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rootsOf(t *testing.T, bundle []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(bundle) {
		t.Fatal("no certificate in the CA bundle")
	}
	return p
}
