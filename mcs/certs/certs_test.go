package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/pemcert"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// years is a duration of y Julian years.
func years(y float64) time.Duration {
	return time.Duration(y * 365.25 * 24 * float64(time.Hour))
}

const testHost = "api-int.example.com"

var testHosts = []string{testHost, "192.0.2.10"}

// pool makes a cert pool of certs.
func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// servedChain reads the chain the server presents.
func servedChain(t *testing.T, st *State) []*x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(st.ServingCertFile)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := pemcert.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return chain
}

// verifyServed verifies the served chain as a client trusting only roots
// would, at now.
func verifyServed(t *testing.T, st *State, now time.Time, roots ...*x509.Certificate) error {
	t.Helper()
	chain := servedChain(t, st)
	_, err := chain[0].Verify(x509.VerifyOptions{
		Roots:         pool(roots...),
		Intermediates: pool(chain[1:]...),
		DNSName:       testHost,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return err
}

// startServer serves the files of st through a Reloader and TLSConfig,
// as the MCS does: tls.NewListener and http.Server.Serve. (httptest's
// StartTLS would add a certificate of its own, served to clients without
// SNI.) It returns the address.
func startServer(t *testing.T, st *State, clk *fakeClock, minVersion uint16, suites []uint16) (string, *Reloader) {
	t.Helper()
	r, err := NewReloader(st.ServingCertFile, st.ServingKeyFile, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			w.Write([]byte(req.Proto))
		}),
		ErrorLog: log.New(io.Discard, "", 0), // refused handshakes are expected
	}
	go srv.Serve(tls.NewListener(ln, TLSConfig(r, minVersion, suites)))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), r
}

// handshake dials addr as an Ignition-like client trusting only roots, with
// the fake time; it returns the connection state.
func handshake(addr string, clk *fakeClock, cfg *tls.Config, roots ...*x509.Certificate) (tls.ConnectionState, error) {
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg = cfg.Clone()
	cfg.RootCAs = pool(roots...)
	cfg.ServerName = testHost
	cfg.Time = clk.Now
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer conn.Close()
	return conn.ConnectionState(), nil
}

// checkState asserts what holds after every Ensure.
func checkState(t *testing.T, st *State, now time.Time) {
	t.Helper()
	bundle, err := pemcert.Parse(st.CABundlePEM)
	if err != nil {
		t.Fatalf("bundle: %v", err)
	}
	if len(bundle) != len(st.CABundle) || !bundle[0].Equal(st.CACert) {
		t.Fatalf("bundle PEM and State disagree, or the active CA is not first")
	}
	for i, c := range bundle {
		if !validAt(c, now) {
			t.Errorf("bundle[%d] %s not valid at %s", i, c.Subject.CommonName, now)
		}
		if err := c.CheckSignatureFrom(c); err != nil || !c.IsCA {
			t.Errorf("bundle[%d] is not a self-signed CA: %v", i, err)
		}
		if i > 0 && c.NotBefore.After(bundle[i-1].NotBefore) {
			t.Errorf("bundle not newest first")
		}
	}
	if err := verifyServed(t, st, now, bundle...); err != nil {
		t.Errorf("served chain does not verify against the bundle: %v", err)
	}
	if err := verifyServed(t, st, now, st.CACert); err != nil {
		t.Errorf("served chain does not verify against the newest CA alone: %v", err)
	}
	chain := servedChain(t, st)
	if !chain[0].Equal(st.ServingCert) {
		t.Errorf("served leaf is not State.ServingCert")
	}
	wantLen := 1
	if st.CrossSignedCA != nil {
		wantLen = 2
		if !chain[1].Equal(st.CrossSignedCA) {
			t.Errorf("served chain[1] is not the cross-signed CA")
		}
	}
	if len(chain) != wantLen {
		t.Errorf("served chain has %d certificates, want %d", len(chain), wantLen)
	}
	onDisk, err := os.ReadFile(st.CABundleFile)
	if err != nil || string(onDisk) != string(st.CABundlePEM) {
		t.Errorf("bundle file differs from State.CABundlePEM (%v)", err)
	}
	for name, want := range map[string]os.FileMode{
		CAKeyFileName: 0o600, ServingKeyFileName: 0o600, CACertFileName: 0o644,
		CABundleFileName: 0o644, ServingCertFileName: 0o644,
	} {
		fi, err := os.Stat(filepath.Join(st.Dir, CurrentLink, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", name, fi.Mode().Perm(), want)
		}
	}
	entries, err := os.ReadDir(st.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{lockName, CurrentLink, genName(st.Generation)}; !slices.Equal(names, want) {
		t.Errorf("state dir holds %v, want %v", names, want)
	}
}

func TestEnsureLifecycle(t *testing.T) {
	dir := t.TempDir()
	clk := &fakeClock{t: t0}
	outer := t
	var (
		ca1, ca2 *x509.Certificate
		ts       string // the server, started once and never restarted
	)
	// Clients the way pointer configs of each era are set up.
	oldClient := func() ([]*x509.Certificate, string) {
		return []*x509.Certificate{ca1}, "pointer config written before rotation (old CA only)"
	}

	steps := []struct {
		name  string
		at    time.Duration
		hosts []string
		check func(t *testing.T, prev, st *State)
	}{
		{
			name: "first use creates CA and serving certificate",
			at:   0, hosts: testHosts,
			check: func(t *testing.T, _, st *State) {
				ca1 = st.CACert
				if st.Generation != 1 || len(st.CABundle) != 1 || st.CrossSignedCA != nil || len(st.Changes) != 2 {
					t.Fatalf("gen %d, bundle %d, cross %v, changes %q", st.Generation, len(st.CABundle), st.CrossSignedCA != nil, st.Changes)
				}
				if !strings.HasPrefix(ca1.Subject.CommonName, CACommonNamePrefix+"@") {
					t.Errorf("CA CN %q", ca1.Subject.CommonName)
				}
				if !ca1.NotAfter.Equal(t0.AddDate(10, 0, 0)) || !ca1.IsCA || ca1.KeyUsage&x509.KeyUsageCertSign == 0 {
					t.Errorf("CA: NotAfter %s IsCA %v KeyUsage %v", ca1.NotAfter, ca1.IsCA, ca1.KeyUsage)
				}
				if k, ok := ca1.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
					t.Errorf("CA key %T, want ECDSA P-256", ca1.PublicKey)
				}
				leaf := st.ServingCert
				if !slices.Equal(leaf.DNSNames, []string{testHost}) || len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != "192.0.2.10" {
					t.Errorf("leaf SANs %v %v", leaf.DNSNames, leaf.IPAddresses)
				}
				if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) || leaf.IsCA {
					t.Errorf("leaf ExtKeyUsage %v IsCA %v", leaf.ExtKeyUsage, leaf.IsCA)
				}
				if !leaf.NotAfter.Equal(t0.AddDate(10, 0, 0)) {
					t.Errorf("leaf NotAfter %s", leaf.NotAfter)
				}
				ts, _ = startServer(outer, st, clk, 0, nil) // lives for all steps
				if _, err := handshake(ts, clk, nil, ca1); err != nil {
					t.Errorf("TLS handshake trusting the CA: %v", err)
				}
			},
		},
		{
			name: "a year later nothing changes",
			at:   years(1), hosts: testHosts,
			check: func(t *testing.T, prev, st *State) {
				if st.Generation != prev.Generation || len(st.Changes) != 0 {
					t.Errorf("gen %d→%d, changes %q", prev.Generation, st.Generation, st.Changes)
				}
				if string(st.CABundlePEM) != string(prev.CABundlePEM) || !st.ServingCert.Equal(prev.ServingCert) {
					t.Errorf("bundle or serving certificate changed")
				}
			},
		},
		{
			name: "past 80% the CA rotates and both old and new pointer configs verify",
			at:   years(8.1), hosts: testHosts,
			check: func(t *testing.T, prev, st *State) {
				ca2 = st.CACert
				if st.Generation != prev.Generation+1 || ca2.Equal(ca1) || ca2.Subject.CommonName == ca1.Subject.CommonName {
					t.Fatalf("CA not rotated: gen %d, changes %q", st.Generation, st.Changes)
				}
				if len(st.CABundle) != 2 || !st.CABundle[0].Equal(ca2) || !st.CABundle[1].Equal(ca1) {
					t.Fatalf("bundle should be [new, old]")
				}
				if st.ServingCert.Equal(prev.ServingCert) || st.ServingCert.CheckSignatureFrom(ca2) != nil {
					t.Errorf("serving certificate not reissued by the new CA")
				}
				cross := st.CrossSignedCA
				if cross == nil || cross.CheckSignatureFrom(ca1) != nil || string(cross.RawSubject) != string(ca2.RawSubject) ||
					!cross.NotAfter.Equal(ca1.NotAfter) || !cross.MaxPathLenZero {
					t.Fatalf("cross-signed CA missing or wrong")
				}
				roots, who := oldClient()
				if err := verifyServed(t, st, clk.Now(), roots...); err != nil {
					t.Errorf("%s: %v", who, err)
				}
				// The cross-signed CA is what makes it work.
				if _, err := st.ServingCert.Verify(x509.VerifyOptions{Roots: pool(ca1), CurrentTime: clk.Now(), DNSName: testHost}); err == nil {
					t.Errorf("leaf verified against the old CA without the cross-signed CA")
				}
				if err := verifyServed(t, st, clk.Now(), st.CABundle...); err != nil {
					t.Errorf("new bundle: %v", err)
				}
				// Real handshakes against the server started at first use.
				for _, c := range []struct {
					name  string
					roots []*x509.Certificate
				}{{"old CA only", []*x509.Certificate{ca1}}, {"new bundle", st.CABundle}, {"new CA only", []*x509.Certificate{ca2}}} {
					cs, err := handshake(ts, clk, nil, c.roots...)
					if err != nil {
						t.Errorf("TLS handshake, client trusting %s: %v", c.name, err)
						continue
					}
					if !cs.PeerCertificates[0].Equal(st.ServingCert) {
						t.Errorf("client trusting %s: served the old certificate, not the rotated one", c.name)
					}
				}
			},
		},
		{
			name: "hosts change reissues only the serving certificate, still cross-signed",
			at:   years(8.2), hosts: append([]string{"API.example.com."}, testHosts...),
			check: func(t *testing.T, prev, st *State) {
				if !st.CACert.Equal(prev.CACert) || string(st.CABundlePEM) != string(prev.CABundlePEM) {
					t.Errorf("CA or bundle changed")
				}
				if st.ServingCert.Equal(prev.ServingCert) || !slices.Equal(st.ServingCert.DNSNames, []string{"api-int.example.com", "api.example.com"}) {
					t.Errorf("serving certificate not reissued for the new hosts: %v", st.ServingCert.DNSNames)
				}
				if st.CrossSignedCA == nil || !st.CrossSignedCA.Equal(prev.CrossSignedCA) {
					t.Errorf("cross-signed CA lost")
				}
				if err := verifyServed(t, st, clk.Now(), ca1); err != nil {
					t.Errorf("old pointer config: %v", err)
				}
			},
		},
		{
			name: "same hosts in another order and case change nothing",
			at:   years(9), hosts: []string{"192.0.2.10", "api.example.com", "API-INT.example.com"},
			check: func(t *testing.T, prev, st *State) {
				if st.Generation != prev.Generation || len(st.Changes) != 0 {
					t.Errorf("changes %q", st.Changes)
				}
			},
		},
		{
			name: "after the old CA expires it leaves the bundle and the chain",
			at:   years(10.1), hosts: []string{"192.0.2.10", "api.example.com", "api-int.example.com"},
			check: func(t *testing.T, prev, st *State) {
				if len(st.CABundle) != 1 || !st.CABundle[0].Equal(ca2) {
					t.Errorf("bundle should be [new] only, has %d", len(st.CABundle))
				}
				if st.CrossSignedCA != nil || len(servedChain(t, st)) != 1 {
					t.Errorf("expired cross-signed CA still served")
				}
				if !st.ServingCert.Equal(prev.ServingCert) {
					t.Errorf("serving certificate reissued needlessly")
				}
				if len(st.Changes) != 2 {
					t.Errorf("changes %q, want the two drops", st.Changes)
				}
				if _, err := handshake(ts, clk, nil, ca1); err == nil {
					t.Errorf("a client trusting only the expired CA still verifies")
				}
				if _, err := handshake(ts, clk, nil, st.CABundle...); err != nil {
					t.Errorf("client trusting the bundle: %v", err)
				}
			},
		},
		{
			name: "the second CA rotates in turn, cross-signed by the second",
			at:   years(16.2), hosts: []string{"192.0.2.10", "api.example.com", "api-int.example.com"},
			check: func(t *testing.T, prev, st *State) {
				if st.CACert.Equal(ca2) || len(st.CABundle) != 2 || !st.CABundle[1].Equal(ca2) {
					t.Fatalf("CA not rotated again")
				}
				if st.CrossSignedCA == nil || st.CrossSignedCA.CheckSignatureFrom(ca2) != nil {
					t.Errorf("not cross-signed by the second CA")
				}
				if _, err := handshake(ts, clk, nil, ca2); err != nil {
					t.Errorf("client trusting only the second CA: %v", err)
				}
			},
		},
	}

	var prev *State
	for _, s := range steps {
		ok := t.Run(s.name, func(t *testing.T) {
			clk.Set(t0.Add(s.at))
			st, err := Ensure(dir, Options{Clock: clk.Now, Hosts: s.hosts})
			if err != nil {
				t.Fatal(err)
			}
			checkState(t, st, clk.Now())
			s.check(t, prev, st)
			prev = st
		})
		if !ok {
			break
		}
		// Let the Reloader look at the files again at the next step.
		clk.Advance(2 * ReloadInterval)
	}
}

func TestEnsureRepairs(t *testing.T) {
	cur := func(dir, name string) string { return filepath.Join(dir, CurrentLink, name) }
	write := func(t *testing.T, path string, b []byte) {
		t.Helper()
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name        string
		damage      func(t *testing.T, dir string)
		wantErr     string
		wantReissue bool
	}{
		{
			name: "truncated serving certificate is replaced",
			damage: func(t *testing.T, dir string) {
				b, _ := os.ReadFile(cur(dir, ServingCertFileName))
				write(t, cur(dir, ServingCertFileName), b[:len(b)/2])
			},
			wantReissue: true,
		},
		{
			name:        "empty serving key is replaced",
			damage:      func(t *testing.T, dir string) { write(t, cur(dir, ServingKeyFileName), nil) },
			wantReissue: true,
		},
		{
			name:        "missing serving certificate is replaced",
			damage:      func(t *testing.T, dir string) { os.Remove(cur(dir, ServingCertFileName)) },
			wantReissue: true,
		},
		{
			name: "serving key of another certificate is replaced",
			damage: func(t *testing.T, dir string) {
				b, _ := os.ReadFile(cur(dir, CAKeyFileName))
				write(t, cur(dir, ServingKeyFileName), b)
			},
			wantReissue: true,
		},
		{
			name: "serving pair from a foreign CA is replaced",
			damage: func(t *testing.T, dir string) {
				other := t.TempDir()
				if _, err := Ensure(other, Options{Clock: func() time.Time { return t0 }, Hosts: testHosts}); err != nil {
					t.Fatal(err)
				}
				for _, n := range []string{ServingCertFileName, ServingKeyFileName} {
					b, _ := os.ReadFile(cur(other, n))
					write(t, cur(dir, n), b)
				}
			},
			wantReissue: true,
		},
		{
			name: "leftovers of interrupted writes are removed",
			damage: func(t *testing.T, dir string) {
				for _, d := range []string{tmpPrefix + "123", genName(99)} {
					if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
						t.Fatal(err)
					}
				}
				write(t, filepath.Join(dir, genName(99), ServingCertFileName), []byte("partial"))
				if err := os.Symlink(genName(99), filepath.Join(dir, tmpLinkName)); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "a lost current link adopts the newest generation, keeping the CA",
			damage: func(t *testing.T, dir string) {
				if err := os.Remove(filepath.Join(dir, CurrentLink)); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name:    "an unreadable CA key is refused, not replaced",
			damage:  func(t *testing.T, dir string) { write(t, cur(dir, CAKeyFileName), []byte("garbage")) },
			wantErr: "refusing to replace a CA",
		},
		{
			name: "a CA bundle without the active CA is refused",
			damage: func(t *testing.T, dir string) {
				other := t.TempDir()
				if _, err := Ensure(other, Options{Clock: func() time.Time { return t0 }, Hosts: testHosts}); err != nil {
					t.Fatal(err)
				}
				b, _ := os.ReadFile(cur(other, CABundleFileName))
				write(t, cur(dir, CABundleFileName), b)
			},
			wantErr: "lacks the active CA",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			clk := &fakeClock{t: t0}
			before, err := Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts})
			if err != nil {
				t.Fatal(err)
			}
			bundleBefore, _ := os.ReadFile(before.CABundleFile)
			c.damage(t, dir)
			clk.Advance(years(0.5))
			st, err := Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				if b, _ := os.ReadFile(filepath.Join(dir, genName(before.Generation), CACertFileName)); string(b) != string(encodeCerts(before.CACert)) {
					t.Errorf("CA certificate was touched")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkState(t, st, clk.Now())
			if !st.CACert.Equal(before.CACert) || string(st.CABundlePEM) != string(bundleBefore) {
				t.Errorf("CA or bundle changed")
			}
			if reissued := !st.ServingCert.Equal(before.ServingCert); reissued != c.wantReissue {
				t.Errorf("serving certificate reissued = %v, want %v (changes %q)", reissued, c.wantReissue, st.Changes)
			}
		})
	}
}

// TestEnsureCrashBeforeSwitch interrupts a CA rotation after the new
// generation is on disk and before it is current: the old state must still
// be whole, and the next Ensure must finish the job.
func TestEnsureCrashBeforeSwitch(t *testing.T) {
	dir := t.TempDir()
	clk := &fakeClock{t: t0}
	before, err := Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts})
	if err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(years(8.1)))
	crash := errors.New("crash")
	_, err = Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts, testHookBeforeSwap: func() error { return crash }})
	if !errors.Is(err, crash) {
		t.Fatalf("err %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, genName(2))); err != nil {
		t.Fatalf("the new generation should be on disk, not current: %v", err)
	}
	// The live state is the old one, complete and consistent.
	m, err := load(filepath.Join(dir, CurrentLink))
	if err != nil || m.leaf == nil {
		t.Fatalf("load: %v %v", err, m.leafErr)
	}
	if !m.ca.Equal(before.CACert) || !m.leaf.Equal(before.ServingCert) {
		t.Fatalf("current changed before the switch")
	}
	if err := verifyServed(t, before, clk.Now(), m.bundle...); err != nil {
		t.Fatalf("served chain no longer verifies against the bundle: %v", err)
	}
	st, err := Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts})
	if err != nil {
		t.Fatal(err)
	}
	checkState(t, st, clk.Now())
	if st.CACert.Equal(before.CACert) || len(st.CABundle) != 2 {
		t.Errorf("rotation not completed")
	}
}

func TestEnsureOptions(t *testing.T) {
	clock := func() time.Time { return t0 }
	cases := []struct {
		name    string
		o       Options
		wantErr string
	}{
		{"no clock", Options{Hosts: testHosts}, "Clock is required"},
		{"no hosts", Options{Clock: clock}, "Hosts is empty"},
		{"bad host", Options{Clock: clock, Hosts: []string{"api int.example.com"}}, "not a DNS name"},
		{"URL as host", Options{Clock: clock, Hosts: []string{"https://api-int.example.com"}}, "not a DNS name"},
		{"IPv6 host", Options{Clock: clock, Hosts: []string{"2001:db8::1"}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Ensure(t.TempDir(), c.o)
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("err %v, want %q", err, c.wantErr)
			}
		})
	}
}

func TestEnsureConcurrent(t *testing.T) {
	dir := t.TempDir()
	clock := func() time.Time { return t0 }
	var wg sync.WaitGroup
	states := make([]*State, 8)
	for i := range states {
		wg.Go(func() {
			st, err := Ensure(dir, Options{Clock: clock, Hosts: testHosts})
			if err != nil {
				t.Error(err)
				return
			}
			states[i] = st
		})
	}
	wg.Wait()
	for _, st := range states {
		if st != nil && !st.CACert.Equal(states[0].CACert) {
			t.Fatalf("concurrent first use made two CAs")
		}
	}
}

// When Ensure did not run during the old CA's last 20%, there is nothing
// left to cross-sign with: the new CA stands alone.
func TestEnsureAfterCAExpired(t *testing.T) {
	dir := t.TempDir()
	clk := &fakeClock{t: t0}
	before, err := Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts})
	if err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(years(10.5)))
	st, err := Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts})
	if err != nil {
		t.Fatal(err)
	}
	checkState(t, st, clk.Now())
	if st.CACert.Equal(before.CACert) || len(st.CABundle) != 1 || st.CrossSignedCA != nil {
		t.Fatalf("want a lone new CA; changes %q", st.Changes)
	}
	if !slices.ContainsFunc(st.Changes, func(s string) bool { return strings.Contains(s, "has expired") }) {
		t.Errorf("changes %q do not say the CA had expired", st.Changes)
	}
}
