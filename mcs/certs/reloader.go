package certs

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ReloadInterval is the least time between two looks at the files.
const ReloadInterval = time.Second

// Reloader serves the certificate chain and key in two files to
// tls.Config.GetCertificate and picks up new files without a restart: at
// most once per [ReloadInterval], on a handshake, it compares the files'
// identity (device and inode), size and modification time with those it
// loaded, and reloads when they differ. Files replaced by renaming (as
// [Ensure] and Kubernetes secret volumes do) and files rewritten in place
// are both noticed.
//
// Files that do not load — unreadable, not PEM, truncated, or a key that
// does not match the certificate — leave the last good certificate in
// service; the failure is kept for [Reloader.LastError] and the same
// broken files are not parsed again until they change. Safe for concurrent
// use.
type Reloader struct {
	certFile, keyFile string
	clock             func() time.Time
	cert              atomic.Pointer[tls.Certificate]

	mu        sync.Mutex // held while checking; guards the fields below
	lastCheck time.Time
	loaded    stamps // the files the served certificate came from
	failed    stamps // files that failed to load
	lastErr   error
}

type stamps struct{ cert, key os.FileInfo }

func (a stamps) same(b stamps) bool {
	return sameFileVersion(a.cert, b.cert) && sameFileVersion(a.key, b.key)
}

func sameFileVersion(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// NewReloader loads certFile (the chain, leaf first) and keyFile; they must
// load now. clock paces the checks.
func NewReloader(certFile, keyFile string, clock func() time.Time) (*Reloader, error) {
	if clock == nil {
		return nil, errors.New("certs: NewReloader needs a clock")
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, clock: clock}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// GetCertificate is for tls.Config.GetCertificate. It never fails: it
// serves the last good certificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.maybeCheck()
	return r.cert.Load(), nil
}

// Certificate returns the certificate being served, after the same
// rate-limited check as GetCertificate.
func (r *Reloader) Certificate() *tls.Certificate {
	r.maybeCheck()
	return r.cert.Load()
}

// LastError returns why the files on disk could not be loaded at the last
// check, or nil if the served certificate is what is on disk.
func (r *Reloader) LastError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// Reload reads the files now, even if they look unchanged, and returns
// what LastError would.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checkLocked(r.clock(), true)
	return r.lastErr
}

func (r *Reloader) maybeCheck() {
	// One goroutine checks; handshakes meanwhile get the current cert.
	if !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	now := r.clock()
	if d := now.Sub(r.lastCheck); !r.lastCheck.IsZero() && d >= 0 && d < ReloadInterval {
		return
	}
	r.checkLocked(now, false)
}

func (r *Reloader) stat() (stamps, error) {
	c, err := os.Stat(r.certFile)
	if err != nil {
		return stamps{}, err
	}
	k, err := os.Stat(r.keyFile)
	if err != nil {
		return stamps{}, err
	}
	return stamps{c, k}, nil
}

func (r *Reloader) checkLocked(now time.Time, force bool) {
	r.lastCheck = now
	st, err := r.stat()
	if err != nil {
		r.lastErr = fmt.Errorf("certs: reload: %w", err)
		return
	}
	if !force && (st.same(r.loaded) || st.same(r.failed)) {
		return
	}
	// The files may be replaced while being read (a generation switch
	// between reading the certificate and the key): read until the files
	// read are the files stat'ed, a few times at most.
	for range 3 {
		var cert tls.Certificate
		var certPEM, keyPEM []byte
		certPEM, err = os.ReadFile(r.certFile)
		if err == nil {
			keyPEM, err = os.ReadFile(r.keyFile)
		}
		after, serr := r.stat()
		if serr != nil {
			err = serr
			break
		}
		if !after.same(st) {
			st = after
			continue
		}
		if err == nil {
			cert, err = tls.X509KeyPair(certPEM, keyPEM)
		}
		if err == nil {
			r.cert.Store(&cert)
			r.loaded, r.failed, r.lastErr = st, stamps{}, nil
			return
		}
		break
	}
	r.failed = st
	r.lastErr = fmt.Errorf("certs: reload %s, %s: %w (still serving the previous certificate)", r.certFile, r.keyFile, err)
	if r.cert.Load() == nil {
		r.lastErr = fmt.Errorf("certs: load %s, %s: %w", r.certFile, r.keyFile, err)
	}
}
