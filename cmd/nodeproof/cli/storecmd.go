package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// The embedded store's files in the state directory, and the local socket
// through which a running directory-mode server answers `nodeproof store`
// (the store file is locked while the server runs).
const (
	storeFileName   = "state.db"
	adminSocketName = "admin.sock"
	// adminBackupPath and adminCheckPath are the socket's endpoints.
	adminBackupPath = "/v1/store/backup"
	adminCheckPath  = "/v1/store/check"
)

// damagedStoreHelp is what an operator reads when the server refuses a
// damaged embedded store.
func damagedStoreHelp(stateDir string) string {
	return fmt.Sprintf("the server will not start on a damaged store; check a backup with `nodeproof store check --file BACKUP` and restore it with "+
		"`nodeproof store restore --state-dir %s --from BACKUP` (the damaged file is kept beside it); docs/operations.md, \"Backup and restore\"", stateDir)
}

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
	path := filepath.Join(dir, storeFileName)
	sock := filepath.Join(dir, adminSocketName)
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

// adminClient is an HTTP client that reaches the server through its
// socket in the state directory.
func adminClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// serverRunning reports whether a server answers on sock.
func serverRunning(sock string) bool {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// checkStore checks the store at path: through the running server when
// one answers on sock (it holds the file), else the file itself.
func checkStore(ctx context.Context, path, sock string) (boltstore.Report, error) {
	if !serverRunning(sock) {
		return boltstore.Check(path, time.Second)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://nodeproof"+adminCheckPath, nil)
	resp, err := adminClient(sock).Do(req)
	if err != nil {
		return boltstore.Report{Path: path}, fmt.Errorf("store check through the server: %w", err)
	}
	defer resp.Body.Close()
	var ans adminCheck
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ans); err != nil {
		return boltstore.Report{Path: path}, fmt.Errorf("store check through the server: %w", err)
	}
	switch {
	case ans.Damage != "":
		return ans.Report, &boltstore.DamagedError{Path: path, What: ans.Damage}
	case ans.Error != "":
		return ans.Report, fmt.Errorf("store check through the server: %s", ans.Error)
	}
	return ans.Report, nil
}

// adminCheck is the socket's answer to a check: the report, and what
// damage was found (DamagedError.What) or what else failed.
type adminCheck struct {
	Report boltstore.Report `json:"report"`
	Damage string           `json:"damage,omitempty"`
	Error  string           `json:"error,omitempty"`
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
	if serverRunning(sock) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://nodeproof"+adminBackupPath, nil)
		resp, err := adminClient(sock).Do(req)
		if err != nil {
			return boltstore.Report{}, fmt.Errorf("store backup through the server: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			return boltstore.Report{}, fmt.Errorf("store backup through the server: %s: %s", resp.Status, strings.TrimSpace(string(b)))
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			return boltstore.Report{}, fmt.Errorf("store backup through the server: %w", err)
		}
	} else if _, err := boltstore.CopyFile(path, time.Second, f); err != nil {
		return boltstore.Report{}, fmt.Errorf("store backup: %w", err)
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

// serveStoreAdmin answers `nodeproof store check` and `store backup` for
// the running server's embedded store on a unix socket at sock (mode
// 0600, in the 0700 state directory: only the server's user reaches it),
// until stop is called. A socket that cannot be made is logged, not
// fatal: backups then need the server stopped.
func serveStoreAdmin(sock string, st *boltstore.Store, log *slog.Logger) (stop func()) {
	os.Remove(sock) // a stale socket of a server that died; a live one holds the store's lock
	ln, err := net.Listen("unix", sock)
	if err != nil {
		log.Error("store admin socket (`nodeproof store backup` and `check` need the server stopped)", "err", err.Error())
		return func() {}
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		log.Error("store admin socket", "err", err.Error())
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+adminBackupPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		n, txid, err := st.Backup(w)
		if err != nil {
			// The status is sent; the client's check of the copy fails.
			log.Error("store backup", "err", err.Error(), "bytes", n)
			return
		}
		log.Info("store backup", "bytes", n, "txid", txid)
	})
	mux.HandleFunc("GET "+adminCheckPath, func(w http.ResponseWriter, r *http.Request) {
		rep, err := st.Check()
		ans := adminCheck{Report: rep}
		var d *boltstore.DamagedError
		switch {
		case errors.As(err, &d):
			ans.Damage = d.What
		case err != nil:
			ans.Error = err.Error()
		}
		if err != nil {
			log.Error("store check", "err", err.Error())
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ans)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return func() {
		srv.Close()
		os.Remove(sock)
	}
}
