package simtpm

import (
	cryptorand "crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// EK keys: RSA-2048 generation costs tens of milliseconds of CPU per key,
// minutes for a thousand machines, and Go (since 1.26) ignores custom
// randomness in key generation, so keys cannot be derived from a seed.
// Instead a file cache holds pre-generated keys, reused across runs:
// machine i of a run gets key i, so machines of one run never share an EK.
// EK certificates are not cached: each NewMachine has the run's vendor CA
// issue one. The keys are test material only.

// ekCacheFile is the cache's file name: PEM "RSA PRIVATE KEY" blocks.
const ekCacheFile = "ek-rsa2048.pem"

// CacheDir is where EKKeys keeps its keys: $NODEPROOF_CACHE/simtpm, or
// ~/.cache/nodeproof/simtpm (the repository's tool cache, as
// internal/testenv.Cache and hack/tools.sh use it).
func CacheDir() string {
	dir := os.Getenv("NODEPROOF_CACHE")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			home = os.TempDir()
		}
		dir = filepath.Join(home, ".cache", "nodeproof")
	}
	return filepath.Join(dir, "simtpm")
}

// EKKeys returns n distinct RSA-2048 EK keys from the cache in CacheDir,
// generating (in parallel) and caching the ones it lacks.
func EKKeys(n int) ([]*rsa.PrivateKey, error) { return LoadEKKeys(CacheDir(), n) }

// LoadEKKeys is EKKeys with the cache in dir.
func LoadEKKeys(dir string, n int) ([]*rsa.PrivateKey, error) {
	if n < 0 {
		return nil, errors.New("simtpm: negative key count")
	}
	path := filepath.Join(dir, ekCacheFile)
	keys, err := readKeys(path, n)
	if err != nil {
		return nil, err
	}
	if len(keys) >= n {
		return keys[:n], nil
	}
	more, err := GenerateEKKeys(n - len(keys))
	if err != nil {
		return nil, err
	}
	keys = append(keys, more...)
	if err := writeKeys(dir, path, keys); err != nil {
		return nil, fmt.Errorf("simtpm: write EK key cache: %w", err)
	}
	return keys, nil
}

// GenerateEKKeys generates n RSA-2048 keys on all CPUs.
func GenerateEKKeys(n int) ([]*rsa.PrivateKey, error) {
	keys := make([]*rsa.PrivateKey, n)
	err := parallel(n, func(i int) error {
		var err error
		keys[i], err = rsa.GenerateKey(cryptorand.Reader, 2048)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("simtpm: generate EK key: %w", err)
	}
	return keys, nil
}

// readKeys reads up to n keys from the cache file (none if it is missing),
// parsing in parallel.
func readKeys(path string, n int) ([]*rsa.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("simtpm: read EK key cache: %w", err)
	}
	var blocks [][]byte
	for len(data) > 0 && len(blocks) < n {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type == "RSA PRIVATE KEY" {
			blocks = append(blocks, b.Bytes)
		}
	}
	keys := make([]*rsa.PrivateKey, len(blocks))
	err = parallel(len(blocks), func(i int) error {
		k, err := x509.ParsePKCS1PrivateKey(blocks[i])
		if err != nil {
			return err
		}
		if k.N.BitLen() != 2048 || k.E != 65537 {
			return errors.New("not an RSA-2048 key with exponent 65537")
		}
		keys[i] = k
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("simtpm: EK key cache %s (delete it to start over): %w", path, err)
	}
	return keys, nil
}

// writeKeys replaces the cache file atomically. Two processes filling it
// at once each write a complete file; the last one stays.
func writeKeys(dir, path string, keys []*rsa.PrivateKey) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ekCacheFile+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	for _, k := range keys {
		if err := pem.Encode(f, &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// NewMachines makes one machine per key, in parallel, all booted from the
// same log (replayed once) and certified by vendor. rand is shared by all
// machines and must then be safe for concurrent use (nil: crypto/rand).
func NewMachines(vendor *tpmtest.VendorCA, log []byte, keys []*rsa.PrivateKey, rand io.Reader, opts ...Option) ([]*Machine, error) {
	banks, err := replayLog(log)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if seen[string(k.N.Bytes())] {
			return nil, errors.New("simtpm: an EK key is given twice; every machine needs its own EK")
		}
		seen[string(k.N.Bytes())] = true
	}
	ms := make([]*Machine, len(keys))
	err = parallel(len(keys), func(i int) error {
		o := append([]Option{WithEKKey(keys[i])}, opts...)
		o = append(o, func(c *config) { c.banks = banks })
		m, err := NewMachine(vendor, log, rand, o...)
		ms[i] = m
		return err
	})
	if err != nil {
		return nil, err
	}
	return ms, nil
}

// parallel runs f(0..n-1) on GOMAXPROCS workers and returns the first
// error.
func parallel(n int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	for range min(n, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil
				mu.Unlock()
				if i >= n || stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}
