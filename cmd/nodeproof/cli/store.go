package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/operate"
)

// cmdStore is `nodeproof store check|backup|restore`.
func cmdStore(ctx context.Context, in *invocation) error {
	fs := in.flags()
	var dir string
	stateDirFlag(fs, &dir)
	file := fs.String("file", "", "check: check this file (a backup) instead of the state directory's store")
	out := fs.String("out", "", "backup: write the backup here (mode 0600)")
	from := fs.String("from", "", "restore: the backup to restore (the state directory's own state.db: accept it as it is)")
	force := fs.Bool("force", false, "restore: even when the store being replaced cannot be read (damaged), so the bans, releases and spent single-use markers made after the backup cannot be carried over")
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
		fmt.Fprintf(stdout, "ok: %s: %s\n", rep.Path, operate.Describe(rep))
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
		fmt.Fprintf(stdout, "backed up %s to %s: %s\n", path, *out, operate.Describe(rep))
		return nil
	case "restore":
		if *from == "" {
			return in.usageError("--from is required")
		}
		res, err := operate.Restore(operate.Restoring{Path: path, From: *from, Force: *force, Lock: time.Second, Now: time.Now()})
		if err != nil {
			return err
		}
		for _, l := range res.Lines {
			fmt.Fprintln(stdout, l)
		}
		return nil
	}
	return in.usageError("unknown action %q", in.action)
}

// checkStore checks the store at path: through the running server when
// one answers on sock (it holds the file), else the file itself.
func checkStore(ctx context.Context, path, sock string) (boltstore.Report, error) {
	c, err := dialServer(ctx, sock)
	if err != nil {
		return boltstore.Report{}, err
	}
	if c != nil {
		return c.Check(ctx, path)
	}
	return boltstore.Check(path, time.Second)
}

// backupStore writes a consistent copy of the store at path to out —
// through the running server when one answers on sock, else from the file
// — then checks the copy, and returns its check. It never follows a link:
// the copy is written to a new file of its own (created exclusively, a
// random name beside out) and renamed over out, which replaces a link at
// out rather than writing through it.
func backupStore(ctx context.Context, path, sock, out string) (boltstore.Report, error) {
	if fi, err := os.Lstat(out); err == nil && !fi.Mode().IsRegular() {
		return boltstore.Report{}, fmt.Errorf("store backup: %s exists and is not a regular file (%s); choose another name", out, fi.Mode().Type())
	}
	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*.tmp")
	if err != nil {
		return boltstore.Report{}, err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	defer f.Close()
	c, err := dialServer(ctx, sock)
	if err != nil {
		return boltstore.Report{}, err
	}
	if c != nil {
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
