// Command mcs is the config-serving benchmark harness (`make bench-mcs`).
//
// It writes an MCO bootstrap directory whose rendered worker config is
// about 500 KB, starts `nodeproof serve` on it as separate processes, and
// drives GET /config/worker over TLS (Ignition's Accept header, the token
// tier so the full config is served) at several concurrency levels, in two
// settings:
//
//   - the serving path: a server with every --limit-* off, keep-alive
//     connections from one source address — what serving a config costs;
//   - a fleet: a server with serve's default limits (as deployed), each
//     request on a new connection from the next of --sources loopback
//     addresses (127.0.0.2 on) — what a fleet of machines, each fetching
//     once, sees: a full TLS handshake per config, and the per-source
//     limits never in the way of honest machines.
//
// For each level it reports requests per second, p50/p99 latency, server
// CPU time per request (from /proc), errors, and the servers' peak RSS.
//
// The baseline, measured in the same run on the same machine with the same
// client pattern, is a bare Go net/http TLS server (same TLS settings,
// HTTP/1.1) serving the same bytes from memory, also as a separate
// process: what any Go server pays for TLS and HTTP. Figures are reported
// as ratios to it. Any failed request, on either server, makes the run
// fail (exit status 1) after the report, with the first errors named.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodeproof/nodeproof/bench/internal/proc"
)

func main() {
	baseline := flag.String("baseline-server", "", "internal: serve this file as the baseline server")
	cert := flag.String("cert", "", "internal: baseline certificate")
	key := flag.String("key", "", "internal: baseline key")
	var o options
	flag.StringVar(&o.nodeproof, "nodeproof", "", "nodeproof binary (built by make bench-mcs)")
	flag.StringVar(&o.levels, "concurrency", "1,8,32,128", "concurrency levels")
	flag.DurationVar(&o.dur, "duration", 5*time.Second, "time per level, setting and server")
	flag.IntVar(&o.sources, "sources", 500, "fleet setting: loopback source addresses the requests rotate over")
	flag.StringVar(&o.out, "o", "", "also write the markdown report here")
	flag.Parse()
	if *baseline != "" {
		if err := serveBaseline(*baseline, *cert, *key); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	nodeproof, levels, out string
	dur                    time.Duration
	sources                int
}

// serveBaseline is the baseline server's process: the bytes of file, over
// TLS 1.2+, HTTP/1.1, nothing else. It prints its address on stdout.
func serveBaseline(file, certFile, keyFile string) error {
	body, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr().String())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
	srv := &http.Server{Handler: h}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	return srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}))
}

type result struct {
	level    int
	requests int64
	errors   int64
	firstErr []string // the first few distinct errors
	elapsed  time.Duration
	p50, p99 time.Duration
	cpu      time.Duration // server CPU during the level
	bytes    int64
}

func (r result) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }
func (r result) cpuPerReq() time.Duration {
	if r.requests == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.requests)
}

// limitsOff are serve's flags with every admission limit off.
var limitsOff = []string{"--limit-attest-per-source", "0", "--limit-config-per-source", "0", "--limit-per-identity", "0",
	"--limit-new-conns-per-source", "0", "--limit-conns-per-source", "0", "--limit-attestations-in-flight", "0"}

func run(o options) error {
	if o.nodeproof == "" {
		return fmt.Errorf("--nodeproof is required")
	}
	if o.sources < 1 || o.sources > 60000 {
		return fmt.Errorf("--sources %d: want 1 to 60000", o.sources)
	}
	var levels []int
	for _, s := range strings.Split(o.levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bad concurrency %q", s)
		}
		levels = append(levels, n)
	}
	dir, err := os.MkdirTemp("", "nodeproof-bench-mcs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	size, err := writeInputs(dir)
	if err != nil {
		return err
	}
	fmt.Printf("rendered worker config: %d KB of MachineConfig files\n", size/1024)

	// Two nodeproof servers, each its own process and state: limits off,
	// and serve's defaults.
	type server struct {
		cmd   *exec.Cmd
		url   string
		token string
	}
	start := func(name string, extra ...string) (*server, []byte, error) {
		state := filepath.Join(dir, "state-"+name)
		args := append([]string{"serve", "--server-basedir", filepath.Join(dir, "bootstrap"),
			"--bootstrap-kubeconfig", filepath.Join(dir, "kubeconfig"), "--policy", filepath.Join(dir, "policy.yaml"),
			"--state-dir", state, "--listen", "127.0.0.1", "--secure-port", "0", "--insecure-port", "0", "--hosts", "127.0.0.1"}, extra...)
		cmd, addr, err := startProcess(o.nodeproof, args)
		if err != nil {
			return nil, nil, err
		}
		bundle, err := os.ReadFile(filepath.Join(state, "certs", "current", "ca-bundle.crt"))
		if err != nil {
			cmd.Process.Kill()
			return nil, nil, err
		}
		tok, err := exec.Command(o.nodeproof, "token", "--state-dir", state).Output()
		if err != nil {
			cmd.Process.Kill()
			return nil, nil, fmt.Errorf("token: %w", err)
		}
		return &server{cmd: cmd, url: "https://" + addr + "/config/worker", token: strings.TrimSpace(string(tok))}, bundle, nil
	}
	open, bundle, err := start("limits-off", limitsOff...)
	if err != nil {
		return err
	}
	defer open.cmd.Process.Kill()
	deployed, bundle2, err := start("defaults")
	if err != nil {
		return err
	}
	defer deployed.cmd.Process.Kill()
	// What nodeproof serves is what the baseline serves.
	body, err := get(keepAlive(bundle, 1), open.url, open.token)
	if err != nil {
		return fmt.Errorf("first fetch: %w", err)
	}
	fmt.Printf("served full config: %d KB (Ignition spec 3.5)\n", len(body)/1024)
	bodyFile := filepath.Join(dir, "body.json")
	if err := os.WriteFile(bodyFile, body, 0o600); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	certDir := filepath.Join(dir, "state-limits-off", "certs", "current")
	base, baseAddr, err := startProcess(self, []string{"--baseline-server", bodyFile,
		"--cert", filepath.Join(certDir, "tls.crt"), "--key", filepath.Join(certDir, "tls.key")})
	if err != nil {
		return err
	}
	defer base.Process.Kill()
	baseURL := "https://" + baseAddr + "/config/worker"

	var report []string
	var failures []string
	table := func(key, title string, np *server, npBundle []byte, mk func(bundle []byte, n int) *http.Client) {
		report = append(report, "", title, "",
			"| concurrency | nodeproof req/s | baseline req/s | ratio | nodeproof p50 / p99 | baseline p50 / p99 | nodeproof CPU/req | baseline CPU/req | CPU ratio | errors |",
			"|---|---|---|---|---|---|---|---|---|---|")
		for _, n := range levels {
			r := load(mk(npBundle, n), np.url, np.token, n, o.dur, np.cmd.Process.Pid)
			bl := load(mk(bundle, n), baseURL, "", n, o.dur, base.Process.Pid)
			report = append(report, fmt.Sprintf("| %d | %.0f | %.0f | %.2f | %s / %s | %s / %s | %s | %s | %.2f | %d |",
				n, r.rps(), bl.rps(), r.rps()/bl.rps(), ms(r.p50), ms(r.p99), ms(bl.p50), ms(bl.p99),
				us(r.cpuPerReq()), us(bl.cpuPerReq()), float64(r.cpuPerReq())/float64(bl.cpuPerReq()), r.errors+bl.errors))
			for _, e := range r.firstErr {
				failures = append(failures, fmt.Sprintf("%s, concurrency %d, nodeproof: %s", key, n, e))
			}
			for _, e := range bl.firstErr {
				failures = append(failures, fmt.Sprintf("%s, concurrency %d, baseline: %s", key, n, e))
			}
		}
	}
	table("serving path", "**The serving path**: limits off, keep-alive connections from one source address", open, bundle, keepAlive)
	table("fleet", fmt.Sprintf("**A fleet**: serve's default limits, a new connection (full TLS handshake) per request, from %d source addresses in turn", o.sources),
		deployed, bundle2, fleetClient(o.sources))
	rssOpen, rssDeployed, rssBL := proc.PeakRSS(open.cmd.Process.Pid), proc.PeakRSS(deployed.cmd.Process.Pid), proc.PeakRSS(base.Process.Pid)
	report = append(report, "", fmt.Sprintf("peak RSS: nodeproof %d MB (limits off), %d MB (defaults); baseline %d MB (ratios %.2f, %.2f)",
		rssOpen>>20, rssDeployed>>20, rssBL>>20, float64(rssOpen)/float64(rssBL), float64(rssDeployed)/float64(rssBL)))
	text := strings.Join(report, "\n") + "\n"
	fmt.Print(text)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(text), 0o644); err != nil {
			return err
		}
	}
	if len(failures) > 0 {
		return fmt.Errorf("requests failed:\n  %s", strings.Join(failures, "\n  "))
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) }

// startProcess runs bin with args and waits until it prints an address
// (the baseline) or logs "serving" (nodeproof, on stderr).
func startProcess(bin string, args []string) (*exec.Cmd, string, error) {
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	addrc := make(chan string, 2)
	exited := make(chan error, 1)
	var mu sync.Mutex
	var last []string // the last lines either stream printed, for a start that fails
	scan := func(r io.Reader, nodeproofLog bool) {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			if last = append(last, line); len(last) > 20 {
				last = last[1:]
			}
			mu.Unlock()
			if !nodeproofLog && strings.Contains(line, ":") {
				addrc <- strings.TrimSpace(line)
			}
			if nodeproofLog && strings.Contains(line, `"msg":"serving"`) {
				i := strings.Index(line, `"secure":"`)
				rest := line[i+len(`"secure":"`):]
				addrc <- rest[:strings.Index(rest, `"`)]
			}
		}
	}
	go scan(stdout, false)
	go scan(stderr, true)
	go func() { exited <- cmd.Wait() }()
	tail := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(last, "\n")
	}
	// Generous: a busy 2-core machine makes the CA's keys slowly.
	select {
	case a := <-addrc:
		return cmd, a, nil
	case err := <-exited:
		return nil, "", fmt.Errorf("%s exited before serving (%v):\n%s", bin, err, tail())
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		return nil, "", fmt.Errorf("%s did not start within 2 minutes:\n%s", bin, tail())
	}
}

// keepAlive is a client that keeps conns connections open to one server,
// from one source address.
func keepAlive(bundle []byte, conns int) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
	}}
}

// fleetClient returns clients that open a new connection for every
// request, each from the next of sources loopback addresses (127.0.0.2
// on), with no TLS session to resume: machines of a fleet, each fetching
// once.
func fleetClient(sources int) func(bundle []byte, conns int) *http.Client {
	var next atomic.Uint32
	return func(bundle []byte, conns int) *http.Client {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(bundle)
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			i := 2 + next.Add(1)%uint32(sources)
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, byte(i>>16), byte(i>>8), byte(i))}}
			return d.DialContext(ctx, network, addr)
		}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool}, DialContext: dial, DisableKeepAlives: true, MaxConnsPerHost: conns,
		}}
	}
}

func get(c *http.Client, url, token string) ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/vnd.coreos.ignition+json;version=3.5.0, */*;q=0.1")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
	}
	return b, err
}

// load runs n workers against url for dur and measures the server pid.
func load(c *http.Client, url, token string, n int, dur time.Duration, pid int) result {
	// Warm the connections first.
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); get(c, url, token) }()
	}
	wg.Wait()
	cpu0 := proc.CPU(pid)
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var reqs, errs, bytes atomic.Int64
	var mu sync.Mutex
	var firstErr []string
	lat := make([][]time.Duration, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for ctx.Err() == nil {
				t0 := time.Now()
				b, err := get(c, url, token)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					errs.Add(1)
					mu.Lock()
					if msg := err.Error(); len(firstErr) < 3 && !slices.Contains(firstErr, msg) {
						firstErr = append(firstErr, msg)
					}
					mu.Unlock()
					continue
				}
				lat[i] = append(lat[i], time.Since(t0))
				reqs.Add(1)
				bytes.Add(int64(len(b)))
			}
		}(i)
	}
	wg.Wait()
	r := result{level: n, requests: reqs.Load(), errors: errs.Load(), firstErr: firstErr, elapsed: time.Since(start), bytes: bytes.Load(), cpu: proc.CPU(pid) - cpu0}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	return r
}
