package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
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
		res, err := boltstore.Restore(path, *from, boltstore.RestoreOptions{Lock: time.Second, Now: time.Now(), Force: *force})
		switch {
		case errors.Is(err, boltstore.ErrCannotCarry):
			return fmt.Errorf("%w\nnothing was restored; --force restores anyway, and every ban, release and spent single-use marker since the backup is then undone", err)
		case err != nil:
			return fmt.Errorf("stop the server first: %w", err)
		}
		fmt.Fprintf(stdout, "restored %s from %s: %s\n", path, *from, describe(res.Backup))
		if res.Replaced != "" {
			fmt.Fprintf(stdout, "the file it replaced is kept as %s\n", res.Replaced)
		}
		printCarried(stdout, res)
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

// printCarried says what a restore kept from the store it replaced, what
// it undid and who enrols again.
func printCarried(w io.Writer, res boltstore.Restored) {
	if res.NotCarried != nil {
		fmt.Fprintf(w, "WARNING: the replaced store could not be read (%v): every ban, release and spent single-use marker made after the backup is undone; revoke, release and rotate the provisioning token again\n", res.NotCarried)
	}
	c := res.Carried
	for _, b := range c.Bans {
		fmt.Fprintf(w, "kept: ban of %s (%s%s), made after the backup\n", b.Identity, orNone(b.NodeName), reasonOf(b.Reason))
	}
	for _, r := range c.Releases {
		how := "its history kept"
		if r.Unbound {
			how = "the backup's binding to it released again"
		}
		fmt.Fprintf(w, "kept: release of %s from %s at %s (%s)\n", r.NodeName, r.Released.Identity, r.Released.Act.At.UTC().Format(time.RFC3339), how)
	}
	for _, n := range c.Adoptions {
		fmt.Fprintf(w, "kept: adoption of %s\n", n)
	}
	if len(c.Consumed) > 0 {
		fmt.Fprintf(w, "kept: %d record(s) whose CSR was approved after the backup stay consumed\n", len(c.Consumed))
	}
	if c.Markers > 0 {
		fmt.Fprintf(w, "kept: %d single-use marker(s) set after the backup (config tokens spent) stay set\n", c.Markers)
	}
	for _, b := range c.Rebanned {
		fmt.Fprintf(w, "banned again: %s (%s%s): unbanned after the backup; a restore lifts no ban, so `nodeproof unban --identity %s` again if meant\n", b.Identity, orNone(b.NodeName), reasonOf(b.Reason), b.Identity)
	}
	if len(c.Lost) > 0 {
		fmt.Fprintf(w, "enrol again: %s (enrolled after the backup; their bindings are not in it)\n", strings.Join(c.Lost, ", "))
	}
	if res.NotCarried == nil && c.Empty() {
		fmt.Fprintln(w, "nothing was done after the backup that the restore undoes")
	}
}

func orNone(name string) string {
	if name == "" {
		return "no name"
	}
	return name
}

func reasonOf(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}
