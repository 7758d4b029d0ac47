package certs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReloader(t *testing.T) {
	dir := t.TempDir()
	clk := &fakeClock{t: t0}
	ensure := func(t *testing.T) *State {
		t.Helper()
		st, err := Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := ensure(t)
	r, err := NewReloader(st.ServingCertFile, st.ServingKeyFile, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	want := st // what the reloader should serve
	var next *State
	current := filepath.Join(dir, CurrentLink)
	corrupt := func(name string, b []byte) func(t *testing.T) {
		return func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(current, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
			clk.Advance(2 * ReloadInterval)
		}
	}

	steps := []struct {
		name    string
		act     func(t *testing.T)
		wantErr bool
	}{
		{name: "serves the certificate on disk"},
		{
			name: "a rotation within the same second is not looked at yet",
			act: func(t *testing.T) {
				clk.Advance(years(8.1))
				r.Certificate() // the last look
				next = ensure(t)
				if next.CACert.Equal(want.CACert) {
					t.Fatal("CA not rotated")
				}
				clk.Advance(ReloadInterval / 2)
			},
		},
		{
			name: "a second later the rotated certificate and chain are served",
			act: func(t *testing.T) {
				clk.Advance(ReloadInterval / 2)
				want = next
			},
		},
		{
			name:    "garbage written over the certificate keeps the last good one",
			act:     corrupt(ServingCertFileName, []byte("garbage")),
			wantErr: true,
		},
		{
			name:    "and the error stays while the file is unchanged",
			act:     func(t *testing.T) { clk.Advance(2 * ReloadInterval) },
			wantErr: true,
		},
		{
			name: "a repaired pair is served and the error clears",
			act: func(t *testing.T) {
				want = ensure(t)
				clk.Advance(2 * ReloadInterval)
			},
		},
		{
			name: "a key that does not match keeps the last good one",
			act: func(t *testing.T) {
				b, _ := os.ReadFile(filepath.Join(current, CAKeyFileName))
				corrupt(ServingKeyFileName, b)(t)
			},
			wantErr: true,
		},
	}
	for _, s := range steps {
		ok := t.Run(s.name, func(t *testing.T) {
			if s.act != nil {
				s.act(t)
			}
			got := r.Certificate()
			if !got.Leaf.Equal(want.ServingCert) {
				t.Errorf("serving %s, want %s", got.Leaf.SerialNumber, want.ServingCert.SerialNumber)
			}
			if wantLen := 1 + btoi(want.CrossSignedCA != nil); len(got.Certificate) != wantLen {
				t.Errorf("chain of %d, want %d", len(got.Certificate), wantLen)
			}
			if err := r.LastError(); (err != nil) != s.wantErr {
				t.Errorf("LastError() = %v, want error: %v", err, s.wantErr)
			}
			if tc, _ := r.GetCertificate(nil); tc != got {
				t.Errorf("GetCertificate and Certificate disagree")
			}
		})
		if !ok {
			break
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestNewReloaderNeedsGoodFiles(t *testing.T) {
	dir := t.TempDir()
	clk := &fakeClock{t: t0}
	st, err := Ensure(dir, Options{Clock: clk.Now, Hosts: testHosts})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		cert, key string
	}{
		{"missing certificate", filepath.Join(dir, "nope.crt"), st.ServingKeyFile},
		{"key swapped for a certificate", st.ServingCertFile, st.ServingCertFile},
		{"mismatched key", st.ServingCertFile, filepath.Join(dir, CurrentLink, CAKeyFileName)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := NewReloader(c.cert, c.key, clk.Now); err == nil {
				t.Fatal("no error")
			}
		})
	}
}
