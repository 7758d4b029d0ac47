package adminsock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/nodeproof/nodeproof/store/boltstore"
)

// Keeper is what the embedded store adds for operators (boltstore.Store):
// a consistent copy of itself, as of one commit, while writes go on
// (Backup), and a check of itself (Check). The socket serves them when
// the store given to Listen has them: GET /v1/store/backup answers the
// copy's bytes, GET /v1/store/check a JSON checkAnswer.
type Keeper interface {
	Backup(w io.Writer) (n int64, txid int, err error)
	Check() (boltstore.Report, error)
}

// The Keeper's endpoints.
const (
	backupPath = "/v1/store/backup"
	checkPath  = "/v1/store/check"
)

// checkAnswer is the answer to a check: the report, and the damage found
// (boltstore.DamagedError.What) or what else failed.
type checkAnswer struct {
	Report boltstore.Report `json:"report"`
	Damage string           `json:"damage,omitempty"`
	Error  string           `json:"error,omitempty"`
}

// keeperRoutes adds the Keeper's endpoints to mux when st is one.
func keeperRoutes(mux *http.ServeMux, st any, log *slog.Logger) {
	k, ok := st.(Keeper)
	if !ok {
		return
	}
	mux.HandleFunc("GET "+backupPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		n, txid, err := k.Backup(w)
		if err != nil {
			// The status is sent: the copy is cut short, and the client's
			// check of it fails.
			log.Error("admin socket: store backup", "err", err.Error(), "bytes", n, "peer", peerOf(r.Context()))
			return
		}
		log.Info("admin socket: store backup", "bytes", n, "txid", txid, "peer", peerOf(r.Context()))
	})
	mux.HandleFunc("GET "+checkPath, func(w http.ResponseWriter, r *http.Request) {
		rep, err := k.Check()
		ans := checkAnswer{Report: rep}
		var d *boltstore.DamagedError
		switch {
		case errors.As(err, &d):
			ans.Damage = d.What
		case err != nil:
			ans.Error = err.Error()
		}
		if err != nil {
			log.Error("admin socket: store check", "err", err.Error(), "peer", peerOf(r.Context()))
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(&ans)
	})
}

// get makes a GET of path on the socket.
func (c *Client) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://nodeproof-admin"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

// Backup writes the running server's consistent copy of its store to w
// and returns its size. A copy cut short is only found by checking it
// (boltstore.Check).
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	resp, err := c.get(ctx, backupPath)
	if err != nil {
		return 0, fmt.Errorf("adminsock: store backup: %w", err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("adminsock: store backup: %w", err)
	}
	return n, nil
}

// Check has the running server check its store; damage is a
// *boltstore.DamagedError naming path.
func (c *Client) Check(ctx context.Context, path string) (boltstore.Report, error) {
	resp, err := c.get(ctx, checkPath)
	if err != nil {
		return boltstore.Report{Path: path}, fmt.Errorf("adminsock: store check: %w", err)
	}
	defer resp.Body.Close()
	var ans checkAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ans); err != nil {
		return boltstore.Report{Path: path}, fmt.Errorf("adminsock: store check: %w", err)
	}
	switch {
	case ans.Damage != "":
		return ans.Report, &boltstore.DamagedError{Path: path, What: ans.Damage}
	case ans.Error != "":
		return ans.Report, fmt.Errorf("the server: store check: %s", ans.Error)
	}
	return ans.Report, nil
}
