package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/leader"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/reload"
)

// KeeperLease is the Lease whose holder writes what a Keeper keeps.
const KeeperLease = "nodeproof-server"

// KeeperOptions say what a Keeper keeps in the cluster and how it leads.
type KeeperOptions struct {
	// Client reaches the API server (required).
	Client kubernetes.Interface
	// Certs keeps the CA and serving certificate in CertsNamespace
	// (mcs/certs/kubecerts), naming Hosts.
	Certs          bool
	CertsNamespace string
	Hosts          []string
	// Tokens keeps the provisioning tokens in Secret machineconfig-auth of
	// TokenSecretNamespace (TokenSecret). LegacyTokensFile, when it
	// exists, holds the tokens of an earlier release (serve's
	// --tokens-file): the leader imports them into the Secret on first
	// start, and every replica accepts them for Grace after the Secret was
	// made. TokenRotateEvery, when not zero, has the leader rotate the
	// token this often; a rotated-out token stays valid for Grace.
	Tokens               bool
	TokenSecretNamespace string
	LegacyTokensFile     string
	Grace                time.Duration
	TokenRotateEvery     time.Duration
	// Reload is how often every replica reads the objects, and the leader
	// makes or rotates what is due (required).
	Reload time.Duration
	// LeaseNamespace holds Lease KeeperLease; Identity is this replica in
	// it (required). The lease timings are leader.Options'.
	LeaseNamespace                            string
	Identity                                  string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Clock                                     func() time.Time
	Log                                       *slog.Logger
}

// Keeper keeps what cluster mode keeps in the cluster's objects: the CA
// and serving certificate (mcs/certs/kubecerts) and the provisioning
// tokens (TokenSecret). Every replica reads them every Reload and serves
// the last good state; only the replica holding the Lease KeeperLease
// writes: it creates them on first start, rotates the certificates,
// rotates the token on the TokenRotateEvery schedule, and (Leading) keeps
// the user-data Secrets current.
type Keeper struct {
	o       KeeperOptions
	certs   *kubecerts.Keeper // nil: certificates are not kept here
	tokSec  *TokenSecret      // nil: tokens are not kept here
	holder  certs.Holder
	leading atomic.Bool

	refused       reload.Refusals // the followers' refusals, each said once
	leaderRefused reload.Refusals // the same, for the leader's passes

	mu   sync.Mutex
	snap *kubecerts.Snapshot // last good
	prov *tokens.Provisioning
}

// StartKeeper begins leader election and waits until the objects it keeps
// exist and load (the leader makes them on first start); it keeps them
// current until ctx ends.
func StartKeeper(ctx context.Context, o KeeperOptions) (*Keeper, error) {
	if o.Client == nil || o.Identity == "" || o.Reload <= 0 || o.Clock == nil || o.Log == nil || (!o.Certs && !o.Tokens) {
		return nil, errors.New("cluster: KeeperOptions: Client, Identity, Reload, Clock, Log and something to keep are required")
	}
	k := &Keeper{o: o}
	if o.Certs {
		var err error
		if k.certs, err = kubecerts.New(kubecerts.Options{Client: o.Client, Namespace: o.CertsNamespace, Hosts: o.Hosts, Clock: o.Clock}); err != nil {
			return nil, err
		}
	}
	if o.Tokens {
		k.tokSec = &TokenSecret{Client: o.Client, Namespace: o.TokenSecretNamespace}
	}
	go leader.Run(ctx, leader.Options{
		Client: o.Client, Namespace: o.LeaseNamespace, Name: KeeperLease, Role: "server", Identity: o.Identity,
		LeaseDuration: o.LeaseDuration, RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod, Log: o.Log,
	}, k.lead)

	// Wait for the state: the leader makes it on first start.
	said := o.Clock()
	for {
		err := k.refresh(ctx)
		if err == nil {
			break
		}
		if now := o.Clock(); now.Sub(said) >= 10*time.Second {
			said = now
			o.Log.Warn("waiting for the cluster's certificate and token objects (the leader makes them on first start)", "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the cluster's certificate and token objects: %w (last: %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	if k.certs != nil {
		owner := "nodeproof (it rotates them)"
		if !k.snap.Owned {
			owner = "not nodeproof (no app.kubernetes.io/managed-by=nodeproof on the CA Secret): served as found, rotated by their owner"
		}
		o.Log.Info("certificates in the cluster", "objects", strings.Join(k.certs.Names(), ", "), "owner", owner,
			"servingNotAfter", k.snap.Serving.NotAfter.UTC().Format(time.RFC3339))
	}
	if k.tokSec != nil {
		o.Log.Info("provisioning tokens in the cluster", "secret", k.tokSec.String(), "rotateEvery", o.TokenRotateEvery.String(), "grace", o.Grace.String())
	}
	go k.follow(ctx)
	return k, nil
}

// KeepsCertificates reports whether the certificates are kept here.
func (k *Keeper) KeepsCertificates() bool { return k != nil && k.certs != nil }

// Serving is the serving certificate read last (for certs.TLSConfig);
// only when KeepsCertificates.
func (k *Keeper) Serving() *certs.Holder { return &k.holder }

// Leading reports whether this replica holds the Lease now.
func (k *Keeper) Leading() bool { return k.leading.Load() }

// refresh reads the objects once; the first successful read also opens
// the provisioning tokens.
func (k *Keeper) refresh(ctx context.Context) error {
	var errs []error
	if k.certs != nil {
		if snap, err := k.certs.Read(ctx); err != nil {
			errs = append(errs, err)
		} else {
			k.install(snap)
		}
	}
	k.mu.Lock()
	prov := k.prov
	k.mu.Unlock()
	if k.tokSec != nil {
		if prov == nil {
			p, err := tokens.Open(ctx, k.tokSec, k.o.Grace, k.o.Clock, false)
			if err != nil {
				errs = append(errs, err)
			} else {
				if err := k.legacyTokens(p); err != nil {
					errs = append(errs, err)
				} else {
					k.mu.Lock()
					k.prov = p
					k.mu.Unlock()
				}
			}
		} else if changed, err := prov.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("provisioning tokens: %w (still accepting the previous ones)", err))
		} else if changed {
			k.o.Log.Info("provisioning tokens reloaded (rotated)")
		}
	}
	if k.certs != nil && k.snapshot() == nil {
		errs = append(errs, errors.New("no certificate yet"))
	}
	return errors.Join(errs...)
}

// legacyTokens makes p also accept the tokens of LegacyTokensFile (the
// nodeproof-provisioning-tokens Secret of earlier releases), when that
// file exists, for Grace after the cluster's Secret was made (the
// migration): pointer configs made from it keep working through the move,
// and a token that leaked from it stops working like any rotated-out one.
// (On first start the leader imports the file's tokens into the Secret,
// so its current token carries on there and rotates normally.)
func (k *Keeper) legacyTokens(p *tokens.Provisioning) error {
	old, err := k.legacy()
	if old == nil || err != nil {
		return err
	}
	until := k.tokSec.Created().Add(k.o.Grace)
	p.Also(old, until)
	k.o.Log.Info("provisioning tokens: also accepting those of --tokens-file, read only, until the grace after the move to the cluster ends",
		"file", k.o.LegacyTokensFile, "until", until.UTC().Format(time.RFC3339))
	return nil
}

// legacy reads LegacyTokensFile; nil when there is none.
func (k *Keeper) legacy() (*tokens.Provisioning, error) {
	path := k.o.LegacyTokensFile
	if path == "" {
		return nil, nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	old, err := tokens.Open(context.Background(), tokens.FileStore(path), k.o.Grace, k.o.Clock, false)
	if err != nil {
		return nil, fmt.Errorf("--tokens-file: %w", err)
	}
	return old, nil
}

// install serves snap when it is new.
func (k *Keeper) install(snap *kubecerts.Snapshot) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.snap != nil && k.snap.Version == snap.Version {
		return
	}
	if err := k.holder.Set(snap.ChainPEM, snap.KeyPEM, "serving certificate"); err != nil {
		return // Read checked the pair
	}
	if k.snap != nil {
		k.o.Log.Info("certificates reloaded from the cluster", "servingNotAfter", snap.Serving.NotAfter.UTC().Format(time.RFC3339))
	}
	k.snap = snap
	k.refused.Forget()
}

func (k *Keeper) snapshot() *kubecerts.Snapshot {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.snap
}

// Provisioning is the token set (nil when tokens are not kept here).
func (k *Keeper) Provisioning() *tokens.Provisioning {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.prov
}

// CABundle is the bundle pointer configs carry.
func (k *Keeper) CABundle() ([]byte, error) {
	snap := k.snapshot()
	if snap == nil {
		return nil, errors.New("no CA bundle read from the cluster yet")
	}
	return snap.BundlePEM, nil
}

// follow re-reads the objects every Reload; a refusal is logged (once per
// distinct refusal) and the last good state stays in service.
func (k *Keeper) follow(ctx context.Context) {
	reload.Every(ctx, k.o.Reload, func(ctx context.Context) {
		if err := k.refresh(ctx); err != nil {
			if say, _ := k.refused.Note(err); say {
				k.o.Log.Error("cluster state refused; still serving the last good one", "err", err.Error())
			}
		}
	})
}

// lead is one leader term: every Reload it makes or rotates the
// certificates and rotates the token when due.
func (k *Keeper) lead(ctx context.Context) {
	k.leading.Store(true)
	defer k.leading.Store(false)
	reload.Now(ctx, k.o.Reload, k.leaderPass)
}

func (k *Keeper) leaderPass(ctx context.Context) {
	if k.certs != nil {
		snap, changes, err := k.certs.Ensure(ctx, false)
		say, _ := k.leaderRefused.Note(err)
		switch {
		case err != nil:
			if say {
				k.o.Log.Error("certificates: not rotated; still serving the last good ones", "err", err.Error())
			}
		default:
			for _, ch := range changes {
				k.o.Log.Info("certificates", "change", ch)
			}
			k.install(snap)
		}
	}
	if k.tokSec == nil {
		return
	}
	prov := k.Provisioning()
	if prov == nil {
		// First start: make the Secret when there is none, with the
		// tokens of LegacyTokensFile when it exists (they carry on there).
		if _, err := k.tokSec.Load(ctx); errors.Is(err, fs.ErrNotExist) {
			how := "created"
			old, err := k.legacy()
			switch {
			case err != nil:
			case old != nil:
				how = "imported from --tokens-file"
				err = k.tokSec.Save(ctx, old.List())
			default:
				_, err = tokens.Open(ctx, k.tokSec, k.o.Grace, k.o.Clock, true)
			}
			if err != nil {
				k.o.Log.Error("provisioning tokens: could not create the Secret", "secret", k.tokSec.String(), "err", err.Error())
			} else {
				k.o.Log.Info("provisioning tokens: "+how, "secret", k.tokSec.String())
			}
		}
		return
	}
	if every := k.o.TokenRotateEvery; every > 0 && prov.Age() >= every {
		if err := prov.Rotate(); err != nil {
			k.o.Log.Error("provisioning token rotation", "err", err.Error())
			prov.Reload() // a conflict: pick up what is there
			return
		}
		k.o.Log.Info("provisioning token rotated", "every", every.String(), "graceOfThePrevious", k.o.Grace.String())
	}
}
