// Package serve is the Machine Config Server as a process, what `nodeproof
// serve` runs: a Config (the command's flags, one field each) becomes a
// running mcs.Server — its policy and the verifiers of the evidence kinds
// the policy takes, the store and its watches, sealing keys, provisioning
// tokens, admission limits, certificates (a state directory, --cert, or
// the cluster's objects through mcs/cluster.Keeper), the config source (a
// directory, or the cluster), both ports with their listeners' limits and
// PROXY protocol, metrics — and is kept current until its context ends: an
// edited policy, rotated keys, tokens and certificates, the store's
// garbage. The operator commands share its store settings (OpenStore).
package serve

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/dirsource"
	"github.com/nodeproof/nodeproof/mcs/limit"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
	"github.com/nodeproof/nodeproof/mcs/seal"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/metrics"
	"github.com/nodeproof/nodeproof/reload"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// Run runs the Machine Config Server until ctx ends: it checks the
// configuration, builds the server's parts (serverOptions), its config
// source (a directory or a cluster), then listens on both ports and keeps
// inputs, keys, tokens and certificates current until ctx ends.
func Run(ctx context.Context, c Config) error {
	clusterMode, err := c.check()
	if err != nil {
		return err
	}
	if err := c.checkStateDir(); err != nil {
		return err
	}
	started := c.Clock()
	c.statusNow = new(statusBox)
	// The ports first: a server that cannot have them takes no Lease and
	// writes nothing, here or to the cluster.
	b, err := c.bindPorts()
	if err != nil {
		return err
	}
	served := false
	defer func() {
		if !served {
			b.close()
		}
	}()
	// What cluster mode keeps in the cluster (certificates, tokens) is
	// there, or made by the leader, before anything is served.
	keeper, err := c.startKeeper(ctx, clusterMode)
	if err != nil {
		return err
	}
	if keeper.KeepsCertificates() {
		c.bundleFrom = keeper.CABundle
	}
	opts, st, conns, closeAll, version, err := c.serverOptions(ctx, clusterMode, keeper.Provisioning())
	if err != nil {
		return err
	}
	defer closeAll()
	// The certificates first: nodeproof's own CA bundle, made here on
	// first start, is what the sources put in the public tier.
	tlsConf, servedCerts, err := c.tlsConfig(keeper)
	if err != nil {
		return err
	}
	var src mcs.Source
	// The policy in force: the first one until the server runs, then
	// whatever a reload made it.
	var live atomic.Pointer[mcs.Server]
	policyNow := func() *policy.Policy {
		if s := live.Load(); s != nil {
			return s.Policy()
		}
		return opts.Policy
	}
	if clusterMode {
		var cls *cluster.Source
		if cls, err = c.clusterSource(policyNow, opts.Provisioning, keeper); err != nil {
			return err
		}
		// Refuse to start without what full configs need, rather than
		// answer every fetch 503; after the start, /healthz says it (for
		// the policy in force: a reload may turn the token tier on).
		if err := cls.Check(ctx, func() bool { return sharedKubeconfig(policyNow()) }); err != nil {
			return fmt.Errorf("serve: cluster mode cannot serve full configs: %w", err)
		}
		src, opts.Health = cls, cls.Health
	} else {
		src, err = dirsource.New(dirsource.Options{Dir: c.ServerBasedir, Kubeconfig: c.BootstrapKube, CABundle: c.caBundle, Reload: c.Reload, Log: c.Log})
	}
	if err != nil {
		return err
	}
	if opts.Configs, err = src.First(); err != nil {
		return err
	}
	opts.Bootstrap = src.Bootstrap()
	reg, m, err := serverMetrics()
	if err != nil {
		return err
	}
	opts.Metrics = m
	srv, err := mcs.New(opts)
	if err != nil {
		return err
	}
	live.Store(srv)
	ports := c.listen(b, srv, tlsConf, conns)
	served = true
	c.Log.Info("serving", "secure", ports.secure.String(), "insecure", fmt.Sprint(ports.insecure),
		"inputs", src.String(), "pools", strings.Join(opts.Configs.Pools(), ","), "stateDir", c.StateDir, "proxyProtocolFrom", fmt.Sprint(c.ProxyProtocolFrom))
	if c.MetricsAddr != "" {
		if err := errors.Join(listenerMetrics(reg, ports), certMetrics(reg, servedCerts, c.caBundle), c.anchorMetrics(reg)); err != nil {
			ports.close()
			return err
		}
		addr, stop, err := metrics.Serve(c.MetricsAddr, reg)
		if err != nil {
			ports.close()
			return fmt.Errorf("serve: %w", err)
		}
		defer stop()
		c.Log.Info("metrics", "addr", addr.String())
	}
	if c.Ready != nil {
		c.Ready(ports.secure, ports.insecure)
	}
	if c.DebugAddr != "" {
		stopDebug, err := serveDebug(c.DebugAddr)
		if err != nil {
			ports.close()
			return err
		}
		defer stopDebug()
	}
	go src.Run(ctx, srv)
	prov := opts.Provisioning
	if keeper.Provisioning() != nil {
		prov = nil // the keeper keeps it current
	}
	var leading func() bool // nil: this server alone writes (directory mode), or every replica (no keeper)
	if keeper != nil {
		leading = keeper.Leading
	}
	fleet, err := newFleetJudge(rejudge.Options{Store: st, Events: opts.Events, Clock: c.Clock, Log: c.Log}, leading, c.Settle(), reg)
	if err != nil {
		ports.close()
		return err
	}
	reloader, err := newPolicyReloader(c, srv, version, fleet, reg)
	if err != nil {
		ports.close()
		return err
	}
	mode := map[bool]string{true: "cluster", false: "directory"}[clusterMode]
	statusFn := func() Status { return c.status(started, mode, ports, servedCerts, reloader) }
	c.statusNow.Store(&statusFn)
	if clusterMode {
		// Each replica says what it judges by and serves, for nodeproof
		// status (directory mode answers on the admin socket).
		if kc, err := c.KubeClient(true); err == nil && kc != nil {
			go c.publishStatus(ctx, kc, statusFn)
		}
	}
	go c.maintain(ctx, clusterMode, st, opts.Keys, prov, servedCerts, reloader)
	ports.serve(ctx, c.Log)
	return nil
}

// checkStateDir makes the state directory (0700) when missing and refuses
// one others can write to or another user owns: what lives there (the CA
// key, the store, the sealing keyring, the admin socket operators trust)
// must be this user's alone, or they could swap any of it.
func (c Config) checkStateDir() error {
	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	dir, err := filepath.EvalSymlinks(c.StateDir)
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := fsutil.CheckPrivate(dir); err != nil {
		return fmt.Errorf("state dir refused: %w", err)
	}
	return nil
}

// judge reads --policy (and what it points to) and makes the verifiers of
// the evidence kinds it takes, retrying a few times when a trust file
// changes while it is read; it returns the version it built.
func (c Config) judge(ctx context.Context) (mcs.Judge, string, error) {
	for try := 0; ; try++ {
		v, err := c.readPolicy()
		if err != nil {
			return mcs.Judge{}, "", err
		}
		j, err := c.judgeVersion(ctx, v)
		if errors.Is(err, errChangedWhileRead) && try < 5 {
			continue
		}
		return j, v.version, err
	}
}

// serverOptions builds everything an mcs.Server needs but its configs:
// the policy (its insecure choices logged), the verifiers of the evidence
// kinds the policy takes, the store, Events, sealing keys, provisioning
// tokens and admission limits (and those of the listeners, returned
// apart), and the store itself (its garbage collection). closeAll
// releases what was opened.
func (c Config) serverOptions(ctx context.Context, clusterMode bool, prov *tokens.Provisioning) (o mcs.Options, st store.Store, conns limit.ListenerOptions, closeAll func(), version string, err error) {
	var closers []func()
	release := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			release() // what was opened before the failure
		}
	}()
	o = mcs.Options{ConfigTokenTTL: c.TokenTTL, Clock: c.Clock, Log: c.Log}
	j, version, err := c.judge(ctx)
	if err != nil {
		return o, nil, conns, nil, "", err
	}
	for _, w := range j.Policy.Warnings() {
		c.Log.Warn("policy: " + w)
	}
	c.Log.Info("policy in force", "file", orDefault(c.Policy, "(none: the public tier only)"), "version", version, "pools", len(j.Policy.Pools))
	o.Policy, o.Verifiers = j.Policy, j.Verifiers
	opened, err := c.OpenStore(clusterMode)
	if err != nil {
		return o, nil, conns, nil, "", err
	}
	st = opened.Store
	o.Store = st
	closers = append(closers, func() { st.Close() })
	if bs := opened.Embedded; bs != nil {
		// Operators act on the running server's store through its admin
		// socket (bbolt locks the file): revoke, release, unban, adopt.
		as, err := adminsock.Listen(adminsock.Path(c.StateDir), bs, c.Log)
		if err != nil {
			return o, nil, conns, nil, "", err
		}
		if box := c.statusNow; box != nil {
			as.ServeStatus(func() any {
				if f := box.Load(); f != nil {
					return (*f)()
				}
				return nil
			})
		}
		go func() {
			if err := as.Serve(); err != nil {
				c.Log.Error("admin socket stopped", "err", err.Error())
			}
		}()
		closers = append(closers, func() { as.Close() })
	}
	if clusterMode && o.Policy.TakesRequestedNames() {
		// A requested name of a Node nodeproof never owned is refused
		// until adopted: the Nodes' names from a watch, not a read per
		// enrolment.
		stop, err := c.watchNodes(ctx, &o)
		if err != nil {
			return o, nil, conns, nil, "", err
		}
		closers = append(closers, stop)
	}
	var watched *kubestore.Watched
	if ks := opened.Kubernetes; ks != nil {
		// A fetch reads the node's binding from a watch, not a GET.
		w, stop, err := c.watchBindings(ctx, ks)
		if err != nil {
			return o, nil, conns, nil, "", err
		}
		closers = append(closers, stop)
		o.Store, watched = w, w
	}
	kc, err := c.KubeClient(clusterMode)
	if err != nil {
		return o, nil, conns, nil, "", err
	}
	if kc != nil {
		// Reports go through a client of their own: their writes cannot
		// hold up the decisions' behind one rate limiter.
		reports, err := c.KubeClient(clusterMode)
		if err != nil {
			return o, nil, conns, nil, "", err
		}
		be := kubestore.NewBindingEvents(kc, reports, c.storeNamespace(), "nodeproof-server")
		if watched != nil {
			be.UIDs(watched.UID) // kubectl describe nodebinding shows them
		}
		closers = append(closers, be.Close)
		o.Events = be
	}
	if o.Keys, err = seal.LoadOrCreate(orDefault(c.KeysFile, filepath.Join(c.StateDir, "keys.json")), c.Clock); err != nil {
		return o, nil, conns, nil, "", err
	}
	o.Keys.SetMaxLife(c.sealedLife())
	if o.Provisioning = prov; prov == nil {
		if o.Provisioning, err = tokens.LoadProvisioning(orDefault(c.TokensFile, filepath.Join(c.StateDir, "tokens.json")), c.Grace, c.Clock); err != nil {
			return o, nil, conns, nil, "", err
		}
	}
	if o.Limits, conns, err = c.Limits.limits(c.Clock); err != nil {
		return o, nil, conns, nil, "", err
	}
	return o, st, conns, release, version, nil
}

// sealedLife is how long anything the server seals can stay valid: the
// longest of a config token and a session, plus the time replicas take to
// reload a rotated keyring (seal.Keyring.SetMaxLife).
func (c Config) sealedLife() time.Duration {
	return max(c.TokenTTL, mcs.DefaultConfigTokenTTL, attest.DefaultSessionTTL) + c.Settle()
}

// maintain reloads an edited policy, renews certificates, picks up rotated keys and provisioning tokens and
// collects garbage in the store, until ctx ends.
func (c Config) maintain(ctx context.Context, clusterMode bool, st store.Store, keys *seal.Keyring, prov *tokens.Provisioning, served certs.Served, pol *policyReloader) {
	lastCerts, lastGC := c.Clock(), c.Clock()
	names := servedNames{c: c}
	reload.Every(ctx, c.Reload, func(ctx context.Context) {
		pol.check(ctx)
		if changed, err := keys.Reload(); err != nil {
			c.Log.Error("sealing keys", "err", err.Error())
		} else if changed {
			c.Log.Info("sealing keys reloaded (rotated)")
			for _, h := range keys.Held() {
				c.Log.Warn("the keyring file dropped a key that can still open live sessions or config tokens; it is kept in memory until then",
					"key", h.ID, "until", h.KeptUntil.UTC().Format(time.RFC3339))
			}
		}
		if prov == nil {
			// kept current by the keeper (mcs/cluster.Keeper)
		} else if changed, err := prov.Reload(); err != nil {
			c.Log.Error("provisioning tokens", "err", err.Error())
		} else if changed {
			c.Log.Info("provisioning tokens reloaded (rotated)")
		}
		now := c.Clock()
		if c.certStore(clusterMode) == storeStateDir && now.Sub(lastCerts) > time.Hour {
			lastCerts = now
			if stt, err := certs.Ensure(filepath.Join(c.StateDir, "certs"), certs.Options{Clock: c.Clock, Hosts: c.Hosts}); err != nil {
				c.Log.Error("certificates", "err", err.Error())
			} else {
				for _, ch := range stt.Changes {
					c.Log.Info("certificates", "change", ch)
				}
			}
		}
		if r, ok := served.(*certs.Reloader); ok {
			if err := r.LastError(); err != nil {
				c.Log.Error("serving certificate reload", "err", err.Error())
			}
			names.check(r)
		}
		if now.Sub(lastGC) > 10*time.Minute {
			lastGC = now
			if n, err := st.GC(ctx, now); err != nil {
				c.Log.Error("store gc", "err", err.Error())
			} else if n > 0 {
				c.Log.Info("store gc", "deleted", n)
			}
		}
	})
}

// servedNames says, once per change, when the certificate the server
// serves names other hosts than its --hosts (someone ran `nodeproof ca
// rotate --serving-only --hosts`, or replaced the files): machines that
// reach it by a --hosts name would fail TLS.
type servedNames struct {
	c    Config
	last string
}

func (n *servedNames) check(r *certs.Reloader) {
	if n.c.CertFile != "" || len(n.c.Hosts) == 0 {
		return // --cert: the operator's own certificate, its own names
	}
	tc := r.Certificate()
	if tc == nil || len(tc.Certificate) == 0 {
		return
	}
	leaf, err := x509.ParseCertificate(tc.Certificate[0])
	if err != nil {
		return
	}
	served := certs.Names(leaf)
	key := strings.Join(served, ",")
	if key == n.last {
		return
	}
	n.last = key
	var missing []string
	for _, h := range n.c.Hosts {
		if leaf.VerifyHostname(h) != nil {
			missing = append(missing, h)
		}
	}
	if len(missing) > 0 {
		n.c.Log.Warn("the serving certificate does not name every --hosts name this server was started with: machines reaching it by those names fail TLS; change it back with nodeproof ca rotate --serving-only --hosts",
			"serving", key, "hosts", strings.Join(n.c.Hosts, ","), "missing", strings.Join(missing, ","))
		return
	}
	n.c.Log.Info("serving certificate", "names", key)
}
