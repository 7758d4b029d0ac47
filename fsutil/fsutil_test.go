package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	for _, content := range []string{"first", "second"} {
		if err := WriteFileAtomic(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != content {
			t.Fatalf("read %q %v, want %q", b, err, content)
		}
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
	if err := WriteFileSync(p, []byte("x"), 0o600); err == nil {
		t.Fatal("WriteFileSync overwrote an existing file")
	}
}

// TestReadFileMax: a file of max bytes reads whole, one byte more is
// ErrTooLarge, a missing file is os.ErrNotExist.
func TestReadFileMax(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		path    string
		want    int
		wantErr error
	}{
		{"at the bound", write("at", 16), 16, nil},
		{"empty", write("empty", 0), 0, nil},
		{"one byte over", write("over", 17), 0, ErrTooLarge},
		{"missing", filepath.Join(dir, "none"), 0, os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ReadFileMax(tc.path, 16)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || len(b) != tc.want {
				t.Errorf("read %d bytes, %v; want %d, %v", len(b), err, tc.want, tc.wantErr)
			}
		})
	}
}
