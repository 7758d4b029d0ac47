package main

import (
	"fmt"
	"log"
	"os"
	"sync"
	"testing"
)

// tb lets the bench call the repository's test helpers (clustertest.Start
// takes a testing.TB) outside `go test`. It implements what those helpers
// call: Helper, Logf, Errorf, Fatalf, TempDir and Cleanup; any other
// testing.TB method panics on the nil embedded interface.
type tb struct {
	testing.TB

	mu       sync.Mutex
	cleanups []func()
	dirs     []string
	verbose  bool
}

// fatal is the panic value of tb.Fatalf; main recovers it, runs the
// cleanups (stopping etcd and kube-apiserver) and exits 1.
type fatal struct{ msg string }

func (t *tb) Helper() {}

func (t *tb) Logf(format string, args ...any) {
	if t.verbose {
		log.Printf(format, args...)
	}
}

func (t *tb) Errorf(format string, args ...any) { log.Printf("error: "+format, args...) }

func (t *tb) Fatalf(format string, args ...any) { panic(fatal{fmt.Sprintf(format, args...)}) }

func (t *tb) Fatal(args ...any) { panic(fatal{fmt.Sprint(args...)}) }

func (t *tb) TempDir() string {
	dir, err := os.MkdirTemp("", "nodeproof-bench-approver-")
	if err != nil {
		t.Fatalf("tempdir: %v", err)
	}
	t.mu.Lock()
	t.dirs = append(t.dirs, dir)
	t.mu.Unlock()
	return dir
}

func (t *tb) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// cleanup runs the cleanups last-in first-out, as testing does, then
// removes the temporary directories.
func (t *tb) cleanup() {
	t.mu.Lock()
	fs, dirs := t.cleanups, t.dirs
	t.cleanups, t.dirs = nil, nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}
