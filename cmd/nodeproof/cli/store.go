package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// cmdStore is `nodeproof store check|backup|restore`.
func cmdStore(ctx context.Context, in *invocation) error {
	fs := in.flags()
	var dir string
	stateDirFlag(fs, &dir)
	file := fs.String("file", "", "check: check this file (a backup) instead of the state directory's store")
	out := fs.String("out", "", "backup: write the backup here (mode 0600)")
	from := fs.String("from", "", "restore: the backup to restore (the state directory's own state.db: accept it as it is)")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	stdout := in.stdout
	path := filepath.Join(dir, serve.StoreFile)
	sock := adminsock.Path(dir)
	switch in.action {
	case "check":
		var rep boltstore.Report
		var err error
		if *file != "" {
			rep, err = boltstore.Check(*file, time.Second)
		} else {
			rep, err = checkStore(ctx, path, sock)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ok: %s: %s\n", rep.Path, describe(rep))
		for _, w := range rep.Warnings {
			fmt.Fprintln(stdout, "warning: "+w)
		}
		return nil
	case "backup":
		if *out == "" {
			return in.usageError("--out is required")
		}
		rep, err := backupStore(ctx, path, sock, *out)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "backed up %s to %s: %s\n", path, *out, describe(rep))
		return nil
	case "restore":
		if *from == "" {
			return in.usageError("--from is required")
		}
		res, err := boltstore.Restore(path, *from, time.Second, time.Now())
		if err != nil {
			return fmt.Errorf("stop the server first: %w", err)
		}
		fmt.Fprintf(stdout, "restored %s from %s: %s\n", path, *from, describe(res.Backup))
		if res.Replaced != "" {
			fmt.Fprintf(stdout, "the file it replaced is kept as %s\n", res.Replaced)
		}
		fmt.Fprintln(stdout, "what was written after the backup is gone: machines enrolled since enrol again, and names released or identities revoked since must be released or revoked again")
		return nil
	}
	return in.usageError("unknown action %q", in.action)
}

// describe says what a report found, in one line.
func describe(rep boltstore.Report) string {
	var buckets []string
	for name, n := range rep.Buckets {
		buckets = append(buckets, fmt.Sprintf("%s=%d", name, n))
	}
	sort.Strings(buckets)
	s := fmt.Sprintf("%d bytes, last commit transaction %d", rep.Size, rep.Txid)
	if rep.Marker > 0 {
		s += fmt.Sprintf(" (commit marker %d)", rep.Marker)
	}
	return s + "; " + strings.Join(buckets, " ")
}

// checkStore checks the store at path: through the running server when
// one answers on sock (it holds the file), else the file itself.
func checkStore(ctx context.Context, path, sock string) (boltstore.Report, error) {
	if c, err := adminsock.Dial(ctx, sock); err == nil {
		return c.Check(ctx, path)
	}
	return boltstore.Check(path, time.Second)
}

// backupStore writes a consistent copy of the store at path to out —
// through the running server when one answers on sock, else from the file
// — then checks the copy, and returns its check.
func backupStore(ctx context.Context, path, sock, out string) (boltstore.Report, error) {
	tmp := out + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return boltstore.Report{}, err
	}
	defer os.Remove(tmp)
	defer f.Close()
	if c, err := adminsock.Dial(ctx, sock); err == nil {
		if _, err := c.Backup(ctx, f); err != nil {
			return boltstore.Report{}, fmt.Errorf("store backup through the server: %w", err)
		}
	} else if _, err := boltstore.CopyFile(path, time.Second, f); err != nil {
		return boltstore.Report{}, fmt.Errorf("store backup (no server answers on %s, so from the file): %w", sock, err)
	}
	if err := f.Sync(); err != nil {
		return boltstore.Report{}, err
	}
	rep, err := boltstore.Check(tmp, time.Second)
	if err != nil {
		return rep, fmt.Errorf("store backup: the copy does not pass its check (not kept): %w", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return rep, err
	}
	rep.Path = out
	return rep, fsutil.SyncDir(filepath.Dir(out))
}
