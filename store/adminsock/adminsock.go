// Package adminsock lets operators' commands act on the embedded store of
// a running server. bbolt locks its file, so while `nodeproof serve` runs
// (directory mode) no other process may open the store; the server instead
// serves the store's operator operations on a unix socket in its state
// directory (Serve), and the commands — revoke, unban, release, adopt,
// enroll --reset, inspect, policy check --against-records — reach it there
// (Dial) when the server runs, and open the file when it
// does not. The operation then happens in the server's own store, at once:
// a revocation refuses the next fetch, re-attestation or CSR, with no
// restart.
//
// Who may use it: the socket is created 0600 in the state directory (0700),
// so only the server's user (root) can connect, and Serve checks the peer's
// credentials (SO_PEERCRED) too: a connection from another uid is closed
// before a byte is read. The other way round, Dial trusts a socket only in
// a directory others cannot write to, owned by this user or root, and
// served by its owner (the server's SO_PEERCRED): an operator's command
// sends nothing to a socket another user put there (ErrUntrusted). Only operators' operations are served: the reads
// (bindings, records, bans, histories, markers), Ban, Revoke, Unban,
// Release, Adopt and ReleaseOnce, and for the embedded store a backup and
// a check of it (Keeper: `nodeproof store backup` and `store check`); what only the server does — enrol, create
// or consume records, set markers, write attestation status, collect
// garbage — is refused (ErrNotServed), so the socket adds no way to forge
// an enrolment. Requests are bounded (MaxRequest bytes, RequestTimeout).
//
// The protocol is HTTP/1.1 over the socket: POST /v1/<operation> with a
// JSON object of the operation's arguments; the answer is a JSON object
// with the result, or the error as a kind (the store's sentinel errors
// travel as kinds, so errors.Is works on the client) and a message.
package adminsock

import (
	"bytes"
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
	"time"

	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/operate"
)

const (
	// SocketName is the socket's name in the server's state directory.
	SocketName = "admin.sock"
	// MaxRequest bounds a request body.
	MaxRequest = 64 << 10
	// RequestTimeout bounds one operation.
	RequestTimeout = 2 * time.Minute
)

// ErrNotServed: the operation is the server's own, not an operator's.
var ErrNotServed = errors.New("adminsock: not an operator's operation (not served on the admin socket)")

// Path is the socket of the server whose state directory is dir.
func Path(dir string) string { return filepath.Join(dir, SocketName) }

// The store's sentinel errors, by kind.
var kinds = map[string]error{
	"NotFound": store.ErrNotFound, "Consumed": store.ErrConsumed, "Used": store.ErrUsed, "Exists": store.ErrExists,
	"NameTaken": store.ErrNameTaken, "IdentityEnrolled": store.ErrIdentityEnrolled, "Revoked": store.ErrRevoked,
	"PoolFixed": store.ErrPoolFixed, "NotServed": ErrNotServed,
}

// args are every operation's arguments (each uses some).
type args struct {
	NodeName string `json:"nodeName,omitempty"`
	Identity string `json:"identity,omitempty"`
	ID       string `json:"id,omitempty"`
	Key      string `json:"key,omitempty"`
	// The workflows' requests (operate).
	Revocation *operate.Revocation `json:"revocation,omitempty"`
	Lift       *operate.Lift       `json:"lift,omitempty"`
	Naming     *operate.Naming     `json:"naming,omitempty"`
}

type answer struct {
	Result json.RawMessage `json:"result,omitempty"`
	Kind   string          `json:"kind,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// ops are the operations served, by name.
var ops = map[string]func(ctx context.Context, st store.Operator, a args) (any, error){
	"Binding": func(ctx context.Context, st store.Operator, a args) (any, error) { return st.Binding(ctx, a.NodeName) },
	"BindingOf": func(ctx context.Context, st store.Operator, a args) (any, error) {
		return st.BindingOf(ctx, a.Identity)
	},
	"Bindings":  func(ctx context.Context, st store.Operator, a args) (any, error) { return st.Bindings(ctx) },
	"GetRecord": func(ctx context.Context, st store.Operator, a args) (any, error) { return st.GetRecord(ctx, a.ID) },
	"RecordsForNode": func(ctx context.Context, st store.Operator, a args) (any, error) {
		return st.RecordsForNode(ctx, a.NodeName)
	},
	"IsUsed":    func(ctx context.Context, st store.Operator, a args) (any, error) { return st.IsUsed(ctx, a.Key) },
	"BanOf":     func(ctx context.Context, st store.Operator, a args) (any, error) { return st.BanOf(ctx, a.Identity) },
	"Bans":      func(ctx context.Context, st store.Operator, a args) (any, error) { return st.Bans(ctx) },
	"History":   func(ctx context.Context, st store.Operator, a args) (any, error) { return st.History(ctx, a.NodeName) },
	"Histories": func(ctx context.Context, st store.Operator, a args) (any, error) { return st.Histories(ctx) },
	// The operator's workflows, run on the server's own store exactly as
	// the command line runs them on a store it opened (package operate).
	"revoke": func(ctx context.Context, st store.Operator, a args) (any, error) {
		if a.Revocation == nil {
			return nil, errors.New("adminsock: revoke needs a revocation")
		}
		return operate.Revoke(ctx, st, *a.Revocation)
	},
	"unban": func(ctx context.Context, st store.Operator, a args) (any, error) {
		if a.Lift == nil {
			return nil, errors.New("adminsock: unban needs a lift")
		}
		return operate.Unban(ctx, st, *a.Lift)
	},
	"release": func(ctx context.Context, st store.Operator, a args) (any, error) {
		if a.Naming == nil {
			return nil, errors.New("adminsock: release needs a naming")
		}
		return operate.Release(ctx, st, *a.Naming)
	},
	"adopt": func(ctx context.Context, st store.Operator, a args) (any, error) {
		if a.Naming == nil {
			return nil, errors.New("adminsock: adopt needs a naming")
		}
		return operate.Adopt(ctx, st, *a.Naming)
	},
	"clearMarker": func(ctx context.Context, st store.Operator, a args) (any, error) {
		return operate.ClearMarker(ctx, st, a.Key)
	},
}

// Handler serves st's operator operations.
func Handler(st store.Operator, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/{op}", func(w http.ResponseWriter, r *http.Request) {
		op, ok := ops[r.PathValue("op")]
		var a args
		var res any
		var err error
		if !ok {
			err = ErrNotServed
		} else if err = json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequest)).Decode(&a); err == nil {
			ctx, cancel := context.WithTimeout(r.Context(), RequestTimeout)
			res, err = op(ctx, st, a)
			cancel()
		}
		var ans answer
		if err != nil {
			ans.Error = err.Error()
			for k, e := range kinds {
				if errors.Is(err, e) {
					ans.Kind = k
				}
			}
		} else if ans.Result, err = json.Marshal(res); err != nil {
			ans = answer{Error: err.Error()}
		}
		if isWrite(r.PathValue("op")) {
			log.Info("admin socket", "op", r.PathValue("op"), "node", a.node(), "identity", a.identity(), "peer", peerOf(r.Context()), "error", ans.Error)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(&ans)
	})
	keeperRoutes(mux, st, log)
	return mux
}

// node and identity are what a request names, for the log.
func (a args) node() string {
	switch {
	case a.Revocation != nil:
		return a.Revocation.Node
	case a.Lift != nil:
		return a.Lift.Node
	case a.Naming != nil:
		return a.Naming.Node
	}
	return a.NodeName
}

func (a args) identity() string {
	switch {
	case a.Revocation != nil:
		return a.Revocation.Identity
	case a.Lift != nil:
		return a.Lift.Identity
	}
	return a.Identity
}

func isWrite(op string) bool {
	switch op {
	case "revoke", "unban", "release", "adopt", "clearMarker":
		return true
	}
	return false
}

type peerKey struct{}

// peerOf is the connection's peer credentials, as Serve found them.
func peerOf(ctx context.Context) string {
	p, _ := ctx.Value(peerKey{}).(string)
	return p
}

// Server is the admin socket of a running server.
type Server struct {
	ln     net.Listener
	http   *http.Server
	path   string
	status func() any
}

// ServeStatus makes GET /v1/status answer f's result as JSON (`nodeproof
// status`: what the server judges by, what it serves); call it before
// Serve. Without it the status is null.
func (s *Server) ServeStatus(f func() any) { s.status = f }

// Listen creates the socket at path, 0600 (a socket left by a server that
// died is replaced: the caller holds the store's lock, so no other server
// uses it), and returns the Server; Serve it.
func Listen(path string, st store.Operator, log *slog.Logger) (*Server, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("adminsock: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("adminsock: remove the stale socket: %w", err)
		}
	}
	ln, err := listenPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("adminsock: %w", err)
	}
	uid := os.Geteuid()
	s := &Server{path: path}
	mux := http.NewServeMux()
	mux.Handle("/", Handler(st, log))
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		var v any
		if s.status != nil {
			v = s.status()
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      RequestTimeout + 10*time.Second,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, peerKey{}, peerString(c))
		},
	}
	s.ln, s.http = &peerCheckListener{Listener: ln, uid: uid, log: log}, srv
	return s, nil
}

// Serve serves until Close.
func (s *Server) Serve() error {
	err := s.http.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving and removes the socket.
func (s *Server) Close() error {
	err := s.http.Close()
	os.Remove(s.path)
	return err
}

// peerCheckListener closes connections from another uid than the server's
// (or root's) before anything is read.
type peerCheckListener struct {
	net.Listener
	uid int
	log *slog.Logger
}

func (l *peerCheckListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, ok := peerUID(c)
		if ok && (uid == l.uid || uid == 0) {
			return c, nil
		}
		l.log.Warn("admin socket: connection refused: not the server's user", "peer", peerString(c))
		c.Close()
	}
}

func peerString(c net.Conn) string {
	if uid, ok := peerUID(c); ok {
		return fmt.Sprintf("uid %d", uid)
	}
	return "unknown"
}

// Client is a running server's admin socket: the store's reads the
// operators' views use (bindings, records, bans, histories, markers) and
// the operator's workflows (operate.Operations), which run in the server.
// What only the server does it does not have.
type Client struct {
	path string
	http *http.Client
}

var (
	_ operate.Operations  = (*Client)(nil)
	_ store.RecordReader  = (*Client)(nil)
	_ store.BindingReader = (*Client)(nil)
	_ store.BanReader     = (*Client)(nil)
	_ store.NameReader    = (*Client)(nil)
	_ store.MarkerReader  = (*Client)(nil)
)

// Dial connects to the socket at path: an error when no server answers
// there (no socket, or one a dead server left).
func Dial(ctx context.Context, path string) (*Client, error) {
	owner, err := trustedSocket(path)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		addr, done, err := sockAddr(path)
		if err != nil {
			return nil, err
		}
		defer done()
		c, err := d.DialContext(ctx, "unix", addr)
		if err != nil {
			return nil, err
		}
		// The process that answers must be the socket's owner: nothing is
		// sent to one that is not (a socket swapped in a directory others
		// could write to, a server of another user).
		if uid, ok := peerUID(c); !ok || uid != owner {
			c.Close()
			return nil, fmt.Errorf("%w: %s is served by uid %d, not by its owner uid %d", ErrUntrusted, path, uid, owner)
		}
		return c, nil
	}
	c, err := dial(ctx, "", "")
	if err != nil {
		return nil, err
	}
	c.Close()
	return &Client{path: path, http: &http.Client{Timeout: RequestTimeout + 10*time.Second, Transport: &http.Transport{DialContext: dial}}}, nil
}

// ErrUntrusted: the admin socket, or the directory it is in, or the
// process serving it, is not the server's user's (or root's): the
// operator's command sends it nothing.
var ErrUntrusted = errors.New("adminsock: not the server's admin socket")

// trustedSocket checks, before anything is sent, that path is a socket
// owned by this process's user or root in a directory only its owner can
// write to (fsutil.CheckPrivate), and returns its owner.
func trustedSocket(path string) (int, error) {
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return 0, err
	}
	if err := fsutil.CheckPrivate(dir); err != nil {
		if errors.Is(err, fsutil.ErrNotPrivate) {
			return 0, fmt.Errorf("%w: %v", ErrUntrusted, err)
		}
		return 0, err
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return 0, fmt.Errorf("%w: %s is not a socket", ErrUntrusted, path)
	}
	owner, ok := fsutil.Owner(fi)
	if !ok || (owner != os.Geteuid() && owner != 0) {
		return 0, fmt.Errorf("%w: %s belongs to uid %d, neither this user (%d) nor root", ErrUntrusted, path, owner, os.Geteuid())
	}
	return owner, nil
}

// Status reads the running server's status (ServeStatus) into out.
func (c *Client) Status(ctx context.Context, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://nodeproof-admin/v1/status", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("adminsock: status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("adminsock: status: %s", resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, MaxRequest)).Decode(out)
}

// call runs op with a and decodes its result into out.
func (c *Client) call(ctx context.Context, op string, a args, out any) error {
	body, err := json.Marshal(&a)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://nodeproof-admin/v1/"+op, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("adminsock: %s: %w", op, err)
	}
	defer resp.Body.Close()
	var ans answer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&ans); err != nil {
		return fmt.Errorf("adminsock: %s: answer: %w", op, err)
	}
	if ans.Error != "" {
		if e, ok := kinds[ans.Kind]; ok {
			return fmt.Errorf("the server: %s: %w", ans.Error, e)
		}
		return fmt.Errorf("the server: %s", ans.Error)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(ans.Result, out)
}

func get[T any](ctx context.Context, c *Client, op string, a args) (T, error) {
	var out T
	err := c.call(ctx, op, a, &out)
	return out, err
}

// Binding reads the server's store.
func (c *Client) Binding(ctx context.Context, nodeName string) (*store.Binding, error) {
	return get[*store.Binding](ctx, c, "Binding", args{NodeName: nodeName})
}

// BindingOf reads the server's store.
func (c *Client) BindingOf(ctx context.Context, identity string) (*store.Binding, error) {
	return get[*store.Binding](ctx, c, "BindingOf", args{Identity: identity})
}

// Bindings reads the server's store.
func (c *Client) Bindings(ctx context.Context) ([]*store.Binding, error) {
	return get[[]*store.Binding](ctx, c, "Bindings", args{})
}

// GetRecord reads the server's store.
func (c *Client) GetRecord(ctx context.Context, id string) (*store.Record, error) {
	return get[*store.Record](ctx, c, "GetRecord", args{ID: id})
}

// RecordsForNode reads the server's store.
func (c *Client) RecordsForNode(ctx context.Context, nodeName string) ([]*store.Record, error) {
	return get[[]*store.Record](ctx, c, "RecordsForNode", args{NodeName: nodeName})
}

// IsUsed reads the server's store.
func (c *Client) IsUsed(ctx context.Context, key string) (bool, error) {
	return get[bool](ctx, c, "IsUsed", args{Key: key})
}

// BanOf reads the server's store.
func (c *Client) BanOf(ctx context.Context, identity string) (*store.Ban, error) {
	return get[*store.Ban](ctx, c, "BanOf", args{Identity: identity})
}

// Bans reads the server's store.
func (c *Client) Bans(ctx context.Context) ([]*store.Ban, error) {
	return get[[]*store.Ban](ctx, c, "Bans", args{})
}

// History reads the server's store.
func (c *Client) History(ctx context.Context, nodeName string) (*store.NameHistory, error) {
	return get[*store.NameHistory](ctx, c, "History", args{NodeName: nodeName})
}

// Histories reads the server's store.
func (c *Client) Histories(ctx context.Context) ([]*store.NameHistory, error) {
	return get[[]*store.NameHistory](ctx, c, "Histories", args{})
}

// Revoke runs operate.Revoke in the server.
func (c *Client) Revoke(ctx context.Context, r operate.Revocation) (*operate.Outcome, error) {
	return get[*operate.Outcome](ctx, c, "revoke", args{Revocation: &r})
}

// Unban runs operate.Unban in the server.
func (c *Client) Unban(ctx context.Context, l operate.Lift) (*operate.Outcome, error) {
	return get[*operate.Outcome](ctx, c, "unban", args{Lift: &l})
}

// Release runs operate.Release in the server.
func (c *Client) Release(ctx context.Context, n operate.Naming) (*operate.Outcome, error) {
	return get[*operate.Outcome](ctx, c, "release", args{Naming: &n})
}

// Adopt runs operate.Adopt in the server.
func (c *Client) Adopt(ctx context.Context, n operate.Naming) (*operate.Outcome, error) {
	return get[*operate.Outcome](ctx, c, "adopt", args{Naming: &n})
}

// ClearMarker runs operate.ClearMarker in the server.
func (c *Client) ClearMarker(ctx context.Context, key string) (*operate.Outcome, error) {
	return get[*operate.Outcome](ctx, c, "clearMarker", args{Key: key})
}

// Close closes the client's connections.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}
