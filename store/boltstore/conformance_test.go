package boltstore

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/storetest"
)

// The store.Store conformance suite, on a new file for each case.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock func() time.Time) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "state.db"), time.Second, clock)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// The store.Lineages conformance suite.
func TestLineageConformance(t *testing.T) {
	storetest.RunLineages(t, func(t *testing.T) store.Lineages {
		s, err := Open(filepath.Join(t.TempDir(), "state.db"), time.Second, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
