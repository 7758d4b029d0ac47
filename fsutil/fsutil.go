// Package fsutil writes files so that a crash leaves the old content or the
// new, never a torn mix: the state a server must not lose (keys, tokens,
// certificates) goes through here; and it checks that a directory holding
// such state is its owner's alone (CheckPrivate).
package fsutil

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteFileSync creates path (it must not exist) with exactly mode, writes
// data and fsyncs the file.
func WriteFileSync(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	// The umask may have narrowed mode; set it exactly.
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// SyncDir fsyncs a directory, making renames and creations in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// WriteFileAtomic replaces path with data: a temporary file in the same
// directory written and fsynced, renamed over path, the directory fsynced.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	f.Close()
	os.Remove(tmp)
	defer os.Remove(tmp)
	if err := WriteFileSync(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// ErrNotPrivate: a directory others can write to, or that another user
// owns (CheckPrivate).
var ErrNotPrivate = errors.New("not private to its owner")

// CheckPrivate refuses a directory (or file) that is a symbolic link,
// writable by its group or by others, or owned by another user than this
// process's (or root): what lives in it — keys, a store, a socket operators
// trust — must be this user's alone. A path that does not exist is
// fs.ErrNotExist.
func CheckPrivate(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symbolic link: %w", path, ErrNotPrivate)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by its group or by others (mode %04o; chmod go-w %s): %w", path, fi.Mode().Perm(), path, ErrNotPrivate)
	}
	if uid, ok := Owner(fi); ok && uid != os.Geteuid() && uid != 0 {
		return fmt.Errorf("%s belongs to uid %d, not to this process's uid %d (or root): %w", path, uid, os.Geteuid(), ErrNotPrivate)
	}
	return nil
}

// ErrTooLarge: a file is over the size its reader takes.
var ErrTooLarge = errors.New("file too large")

// ReadFileMax reads the file at path whole when it holds at most max
// bytes, never more than max+1 of them (ErrTooLarge, wrapped, when it
// holds more): for files whose contents are parsed and whose size an
// attacker or a mistake may choose.
func ReadFileMax(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: over %d bytes: %w", path, max, ErrTooLarge)
	}
	return b, nil
}
