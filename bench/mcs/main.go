// Command mcs is the config-serving benchmark harness (`make bench-mcs`).
//
// It writes an MCO bootstrap directory whose rendered worker config is
// about 500 KB, starts `nodeproof serve` on it as a separate process, and
// drives GET /config/worker over TLS (keep-alive, Ignition's Accept header,
// the token tier so the full config is served) at several concurrency
// levels. For each level it reports requests per second, p50/p99 latency,
// server CPU time per request (from /proc) and the server's peak RSS.
//
// The baseline, measured in the same run on the same machine, is a bare Go
// net/http TLS server (same TLS settings, HTTP/1.1) serving the same bytes
// from memory, also as a separate process: what any Go server pays for TLS
// and HTTP. Figures are reported as ratios to it.
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
	nodeproof := flag.String("nodeproof", "", "nodeproof binary (built by make bench-mcs)")
	levels := flag.String("concurrency", "1,8,32,128", "concurrency levels")
	dur := flag.Duration("duration", 5*time.Second, "time per level and server")
	out := flag.String("o", "", "also write the markdown table here")
	flag.Parse()
	if *baseline != "" {
		if err := serveBaseline(*baseline, *cert, *key); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(*nodeproof, *levels, *dur, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
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

func run(nodeproof, levelList string, dur time.Duration, out string) error {
	if nodeproof == "" {
		return fmt.Errorf("--nodeproof is required")
	}
	var levels []int
	for _, s := range strings.Split(levelList, ",") {
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

	// nodeproof serve, as its own process.
	state := filepath.Join(dir, "state")
	srv, addr, err := startProcess(nodeproof, []string{"serve", "--server-basedir", filepath.Join(dir, "bootstrap"),
		"--bootstrap-kubeconfig", filepath.Join(dir, "kubeconfig"), "--policy", filepath.Join(dir, "policy.yaml"),
		"--state-dir", state, "--listen", "127.0.0.1", "--secure-port", "0", "--insecure-port", "0", "--hosts", "127.0.0.1"})
	if err != nil {
		return err
	}
	defer srv.Process.Kill()
	bundle, err := os.ReadFile(filepath.Join(state, "certs", "current", "ca-bundle.crt"))
	if err != nil {
		return err
	}
	tok, err := exec.Command(nodeproof, "token", "--state-dir", state).Output()
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	token := strings.TrimSpace(string(tok))
	url := "https://" + addr + "/config/worker"
	// What nodeproof serves is what the baseline serves.
	body, err := get(client(bundle, 1), url, token)
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
	certDir := filepath.Join(state, "certs", "current")
	base, baseAddr, err := startProcess(self, []string{"--baseline-server", bodyFile,
		"--cert", filepath.Join(certDir, "tls.crt"), "--key", filepath.Join(certDir, "tls.key")})
	if err != nil {
		return err
	}
	defer base.Process.Kill()
	baseURL := "https://" + baseAddr + "/config/worker"

	var rows []string
	rows = append(rows, "| concurrency | nodeproof req/s | baseline req/s | ratio | nodeproof p50 / p99 | baseline p50 / p99 | nodeproof CPU/req | baseline CPU/req | CPU ratio | errors |",
		"|---|---|---|---|---|---|---|---|---|---|")
	for _, n := range levels {
		// Alternate which server goes first, so drift hurts both alike.
		np := load(client(bundle, n), url, token, n, dur, srv.Process.Pid)
		bl := load(client(bundle, n), baseURL, "", n, dur, base.Process.Pid)
		rows = append(rows, fmt.Sprintf("| %d | %.0f | %.0f | %.2f | %s / %s | %s / %s | %s | %s | %.2f | %d |",
			n, np.rps(), bl.rps(), np.rps()/bl.rps(), ms(np.p50), ms(np.p99), ms(bl.p50), ms(bl.p99),
			us(np.cpuPerReq()), us(bl.cpuPerReq()), float64(np.cpuPerReq())/float64(bl.cpuPerReq()), np.errors+bl.errors))
	}
	rssNP, rssBL := proc.PeakRSS(srv.Process.Pid), proc.PeakRSS(base.Process.Pid)
	rows = append(rows, "", fmt.Sprintf("peak RSS: nodeproof %d MB, baseline %d MB (ratio %.2f)", rssNP>>20, rssBL>>20, float64(rssNP)/float64(rssBL)))
	table := strings.Join(rows, "\n") + "\n"
	fmt.Print("\n" + table)
	if out != "" {
		return os.WriteFile(out, []byte(table), 0o644)
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
	scan := func(r io.Reader, nodeproofLog bool) {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
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
	select {
	case a := <-addrc:
		return cmd, a, nil
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return nil, "", fmt.Errorf("%s did not start", bin)
	}
}

func client(bundle []byte, conns int) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
	}}
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
					continue
				}
				lat[i] = append(lat[i], time.Since(t0))
				reqs.Add(1)
				bytes.Add(int64(len(b)))
			}
		}(i)
	}
	wg.Wait()
	r := result{level: n, requests: reqs.Load(), errors: errs.Load(), elapsed: time.Since(start), bytes: bytes.Load(), cpu: proc.CPU(pid) - cpu0}
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
