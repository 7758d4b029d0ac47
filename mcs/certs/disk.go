package certs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nodeproof/nodeproof/fsutil"
)

const (
	genPrefix   = "gen-"
	tmpPrefix   = ".tmp-gen-"
	tmpLinkName = ".current.tmp"
	lockName    = ".lock"
)

func genName(n int) string { return fmt.Sprintf("%s%06d", genPrefix, n) }

func parseGenName(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, genPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || genName(n) != name {
		return 0, false
	}
	return n, true
}

// currentGeneration returns the generation "current" points to, 0 when
// there is none yet. Without the symlink (a crash between creating the
// first generation and linking it, or a link removed by hand) the newest
// complete generation is adopted rather than a new CA created.
// linked is false when the generation was adopted that way.
func currentGeneration(dir string) (gen int, linked bool, err error) {
	target, err := os.Readlink(filepath.Join(dir, CurrentLink))
	if err == nil {
		n, ok := parseGenName(target)
		if !ok {
			return 0, false, fmt.Errorf("certs: %s points to %q, not to a generation directory in %s", filepath.Join(dir, CurrentLink), target, dir)
		}
		return n, true, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return 0, false, fmt.Errorf("certs: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, false, fmt.Errorf("certs: %w", err)
	}
	newest := 0
	for _, e := range entries {
		if n, ok := parseGenName(e.Name()); ok && e.IsDir() && n > newest {
			newest = n
		}
	}
	return newest, false, nil
}

// writeGeneration writes files as generation gen and makes it current:
// temporary directory, every file fsynced, the directory fsynced, renamed
// to gen-N, parent fsynced, a new symlink renamed over "current", parent
// fsynced.
func writeGeneration(dir string, gen int, files map[string]fileData, beforeSwap func() error) error {
	tmp, err := os.MkdirTemp(dir, tmpPrefix)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	for name, f := range files {
		if err := fsutil.WriteFileSync(filepath.Join(tmp, name), f.data, f.mode); err != nil {
			return fmt.Errorf("certs: write %s: %w", name, err)
		}
	}
	if err := fsutil.SyncDir(tmp); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	final := filepath.Join(dir, genName(gen))
	// A leftover from an attempt that crashed before linking it; it was
	// never current.
	if err := os.RemoveAll(final); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := fsutil.SyncDir(dir); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if beforeSwap != nil {
		if err := beforeSwap(); err != nil {
			return err
		}
	}
	link := filepath.Join(dir, tmpLinkName)
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.Symlink(genName(gen), link); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.Rename(link, filepath.Join(dir, CurrentLink)); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := fsutil.SyncDir(dir); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}

// removeStale removes generations other than keep and leftovers of
// interrupted writes. Failures are harmless (the next call retries) and
// ignored.
func removeStale(dir string, keep int) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		n, isGen := parseGenName(name)
		if (isGen && n != keep) || strings.HasPrefix(name, tmpPrefix) || name == tmpLinkName {
			os.RemoveAll(filepath.Join(dir, name))
		}
	}
}
