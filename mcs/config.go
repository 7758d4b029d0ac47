package mcs

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/store"
)

// poolName is what a pool may be called: a Kubernetes object name.
var poolName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// serveConfig answers GET|HEAD /config/<pool>.
//
// Which tier a request gets, in order:
//  1. A config token (Authorization: Bearer np1.… or ?token=np1.…): it must
//     open (TokenInvalid), be unexpired (TokenExpired), name this pool
//     (TokenForAnotherPool), be unused (TokenAlreadyUsed; it is spent as
//     the body starts to leave: only a config that could not be rendered,
//     or a HEAD, leaves it usable), its record must exist, and its node's
//     binding must stand (NotEnrolled, NodeNameTaken, Revoked), and the pool must
//     accept attested fetches (TierDisabled) → the full config for that
//     node.
//  2. Another bearer token: the pool must take the token tier and the token
//     must be a valid provisioning token (TokenInvalid) → the full config.
//  3. No credentials: serve.fullWithoutCredentials → the full config
//     (migration only); else the public tier if the pool serves it, else
//     CredentialsRequired.
//
// The plain-HTTP port serves what serve.insecurePort allows: "public"
// refuses a request carrying any credentials — any Authorization header,
// any token parameter, used or not (a token sent in clear is spent) —
// "none" refuses everything.
func (s *Server) serveConfig(w http.ResponseWriter, r *http.Request, port Port, d *decision) {
	pool := strings.TrimPrefix(r.URL.Path, "/config/")
	if !poolName.MatchString(pool) {
		s.refuse(w, d, deny(attest.ReasonBadPath, "not a pool name"))
		return
	}
	d.pool = pool
	serve := s.pol().ServeFor(pool)
	token := bearer(r)
	if port == Insecure {
		switch serve.InsecurePort {
		case "none":
			s.refuse(w, d, attest.DenySetting(attest.ReasonInsecurePort, "pools."+pool+".serve.insecurePort", "pool %s is not served on the plain-HTTP port: pools.%s.serve.insecurePort is none; use the TLS port", pool, pool))
			return
		case "", "public":
			if token != "" || len(r.Header.Values("Authorization")) > 0 || r.URL.Query().Has("token") {
				s.refuse(w, d, attest.DenySetting(attest.ReasonInsecurePort, "pools."+pool+".serve.insecurePort", "credentials are not accepted over plain HTTP; use the TLS port (pools.%s.serve.insecurePort: all would accept them here)", pool))
				return
			}
		}
	}
	accept := r.Header.Get("Accept")
	ctx := r.Context()
	switch {
	case token != "" && tokens.IsConfigToken(token):
		d.cred = "config"
		s.serveAttested(ctx, w, r, d, serve, pool, accept, token)
	case token != "":
		d.cred = "provisioning"
		if !serve.Token || s.o.Provisioning == nil {
			s.refuse(w, d, attest.DenySetting(attest.ReasonTierDisabled, "pools."+pool+".serve.token", "pool %s does not take provisioning tokens (pools.%s.serve.token)", pool, pool))
			return
		}
		if !s.o.Provisioning.Check(token) {
			s.refuse(w, d, deny(attest.ReasonTokenInvalid, "provisioning token is not valid"))
			return
		}
		d.tier = "token"
		s.deliver(w, r, d, s.full(pool, accept, nil), nil)
	case serve.FullWithoutCredentials:
		d.tier = "full-unauthenticated"
		s.deliver(w, r, d, s.full(pool, accept, nil), nil)
	case serve.PublicTier():
		d.tier = "public"
		s.deliver(w, r, d, func() ([][]byte, error) {
			b, err := s.cfg().Public(pool, accept)
			return [][]byte{b}, err
		}, nil)
	default:
		if !s.poolExists(pool) {
			s.refuse(w, d, deny(attest.ReasonUnknownPool, "no pool %q", pool))
			return
		}
		s.refuse(w, d, attest.DenySetting(attest.ReasonCredentials, "pools."+pool+".serve.public", "pool %s needs a provisioning token or attestation: its public tier is off (pools.%s.serve.public)", pool, pool))
	}
}

func (s *Server) poolExists(pool string) bool {
	for _, p := range s.cfg().Pools() {
		if p == pool {
			return true
		}
	}
	return false
}

func (s *Server) serveAttested(ctx context.Context, w http.ResponseWriter, r *http.Request, d *decision, serve policy.Serve, pool, accept, token string) {
	ct, err := tokens.OpenConfigToken(s.o.Keys, token, s.o.Clock())
	switch {
	case errors.Is(err, tokens.ErrTokenExpired):
		s.refuse(w, d, deny(attest.ReasonTokenExpired, "config token has expired; attest again"))
		return
	case err != nil:
		s.refuse(w, d, deny(attest.ReasonTokenInvalid, "config token is not valid"))
		return
	}
	d.node, d.record = ct.NodeName, ct.RecordID
	if ct.Pool != pool {
		s.refuse(w, d, deny(attest.ReasonTokenWrongPool, "config token is for another pool"))
		return
	}
	if !serve.AttestedTier() {
		s.refuse(w, d, attest.DenySetting(attest.ReasonTierDisabled, "pools."+pool+".serve.attested", "pool %s does not take attested fetches (pools.%s.serve.attested)", pool, pool))
		return
	}
	rec, err := s.tokenRecord(ctx, ct)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			s.refuse(w, d, deny(attest.ReasonTokenInvalid, "config token's record is gone"))
		} else {
			s.refuse(w, d, err)
		}
		return
	}
	// The enrolment must still stand: not revoked, not released since.
	switch b, err := s.o.Store.Binding(ctx, rec.NodeName); {
	case errors.Is(err, store.ErrNotFound):
		s.refuse(w, d, deny(attest.ReasonNotEnrolled, "node %s was released after this token was issued; attest again", rec.NodeName))
		return
	case err != nil:
		s.refuse(w, d, err)
		return
	case b.Identity != rec.Identity:
		s.refuse(w, d, deny(attest.ReasonNodeNameTaken, "node %s belongs to another identity now", rec.NodeName))
		return
	case b.Revoked != nil:
		s.refuse(w, d, deny(attest.ReasonRevoked, "node %s was revoked by an operator", rec.NodeName))
		return
	}
	release, err := s.spendConfigToken(ctx, ct, rec)
	if err != nil {
		if errors.Is(err, store.ErrUsed) {
			s.refuse(w, d, deny(attest.ReasonTokenUsed, "config token was already used"))
		} else {
			s.refuse(w, d, err)
		}
		return
	}
	d.tier = "attested"
	s.deliver(w, r, d, s.full(pool, accept, rec), release)
}

// tokenRecord is what the fetch needs of the config token's record: sealed
// in the token at verify (its identity, bootstrap token and expiry), so no
// read of it; from the store for a token of an older server (which helps
// without per-node bootstrap tokens only: in cluster mode such a token finds
// the token Secret the older server made at verify, is refused TokenUsed,
// and the agent attests again). The bootstrap
// token's secret comes with the token either way (no read of its Secret).
// Whether the enrolment still stands is the binding's to say, read next.
func (s *Server) tokenRecord(ctx context.Context, ct *tokens.ConfigToken) (*store.Record, error) {
	rec := &store.Record{ID: ct.RecordID, NodeName: ct.NodeName, Pool: ct.Pool, Identity: ct.Identity,
		BootstrapTokenID: ct.BootstrapTokenID, Expires: ct.RecordExpires}
	if ct.Identity == "" {
		var err error
		if rec, err = s.o.Store.GetRecord(ctx, ct.RecordID); err != nil {
			return nil, err
		}
	}
	if rec.BootstrapTokenID != "" {
		rec.BootstrapTokenSecret = ct.Bootstrap
	}
	return rec, nil
}

// spendConfigToken marks ct used, before any byte of its config leaves,
// and returns what unmarks it (when no byte left after all). With
// per-node bootstrap tokens (cluster mode) the mark is the record's token
// Secret, made now (BootstrapTokens.Activate): one write for both. Else it
// is a single-use marker of its own.
func (s *Server) spendConfigToken(ctx context.Context, ct *tokens.ConfigToken, rec *store.Record) (release func(), err error) {
	if s.o.Bootstrap != nil && rec.BootstrapTokenID != "" {
		if err := s.o.Bootstrap.Activate(ctx, rec); err != nil {
			return nil, err
		}
		return func() {
			if err := s.o.Bootstrap.Revoke(context.WithoutCancel(ctx), rec); err != nil {
				s.o.Log.Error("release config token (its bootstrap token)", "record", ct.RecordID, "err", err.Error())
			}
		}, nil
	}
	once := configTokenOnce(ct.ID)
	if err := s.o.Store.UseOnce(ctx, once, ct.Expires); err != nil {
		return nil, err
	}
	return func() {
		// No byte of the config left: the token may be used again.
		if err := s.o.Store.ReleaseOnce(context.WithoutCancel(ctx), once); err != nil {
			s.o.Log.Error("release config token marker", "record", ct.RecordID, "err", err.Error())
		}
	}, nil
}

// configTokenOnce is the single-use marker of a config token.
func configTokenOnce(id string) string { return "config-token/" + id }

// full renders a full config, in shared pieces where the Configs can.
func (s *Server) full(pool, accept string, node *store.Record) func() ([][]byte, error) {
	return func() ([][]byte, error) {
		c := s.cfg()
		if pc, ok := c.(PartsConfigs); ok {
			return pc.FullParts(pool, accept, node)
		}
		b, err := c.Full(pool, accept, node)
		return [][]byte{b}, err
	}
}

// deliver renders and writes a config. undo, if set, runs when no byte of
// the body can have left: rendering failed, or the request was a HEAD.
func (s *Server) deliver(w http.ResponseWriter, r *http.Request, d *decision, render func() ([][]byte, error), undo func()) {
	parts, err := render()
	if err != nil {
		if undo != nil {
			undo()
		}
		switch {
		case errors.Is(err, ErrUnknownPool):
			s.refuse(w, d, deny(attest.ReasonUnknownPool, "no pool %q", d.pool))
		case errors.Is(err, ErrSpecVersion):
			s.refuse(w, d, deny(attest.ReasonSpecVersion, "%v", err))
		case errors.Is(err, ErrNotReady):
			s.refuse(w, d, deny(attest.ReasonConfigUnavailable, "the config for pool %s is not ready yet; retry", d.pool))
		default:
			s.o.Log.Error("render config", "pool", d.pool, "tier", d.tier, "err", err.Error())
			why := "the config for pool %s cannot be rendered now"
			if s.o.Health != nil {
				if herr := s.o.Health(); herr != nil {
					// What the server lacks, for the machine's console
					// (the agent prints it): the operator's fix.
					s.refuse(w, d, deny(attest.ReasonConfigUnavailable, why+": the server lacks %v", d.pool, herr))
					return
				}
			}
			s.refuse(w, d, deny(attest.ReasonConfigUnavailable, why, d.pool))
		}
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	h.Set("Content-Length", strconv.Itoa(size))
	h.Set("Cache-Control", "no-store")
	if r.Method != http.MethodHead {
		// A machine that has its config asks nothing more on this
		// connection (it boots, or hands the config to Ignition): closed
		// now, not held idle until IdleTimeout — thousands of idle TLS
		// connections after a burst are tens of kilobytes each of heap,
		// which under GOMEMLIMIT is GC work for everyone still attesting.
		h.Set("Connection", "close")
	}
	w.WriteHeader(http.StatusOK)
	d.status = http.StatusOK
	if r.Method == http.MethodHead {
		if undo != nil {
			undo() // HEAD delivers nothing: the token stays usable
		}
		return
	}
	// From here the token is spent, whatever happens: once any of the body
	// may have left, the client may hold the start of the secrets (a
	// client that reads a little, closes and asks again gets
	// TokenAlreadyUsed). A node whose delivery was cut attests again for a
	// new token (agent.Client.AttestAndFetch).
	for _, p := range parts {
		n, werr := w.Write(p)
		d.bytes += n
		if werr != nil {
			break
		}
	}
}

// bearer returns the token from `Authorization: Bearer` or `?token=`.
func bearer(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			return strings.TrimSpace(h[7:])
		}
		return ""
	}
	return r.URL.Query().Get("token")
}
