package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/mcs/render"
)

// ControllerConfigName is the ControllerConfig the MCS reads (MCO
// pkg/controller/common ControllerConfigName): the machine-config-controller
// keeps exactly one, of this name. Others are ignored.
const ControllerConfigName = "machine-config-controller"

// Defaults of WatchOptions.
const (
	DefaultDebounce = time.Second
	DefaultMaxDelay = 10 * time.Second
)

// WatchOptions configure Watch.
type WatchOptions struct {
	// OnInputs receives the inputs: once when the caches have synced, then
	// after every change that can alter what is served (see Watch). Calls
	// are sequential, never concurrent; a slow OnInputs delays the next.
	// Required.
	OnInputs func(*render.Inputs)
	// OnError receives what goes wrong without ending the watch: a failed
	// list or watch (retried with backoff by client-go), inputs that do not
	// build. Nil drops them.
	OnError func(error)
	// Debounce is how long the watch waits after a change for more changes
	// before it builds inputs (default DefaultDebounce): the MCO writes a
	// rendered MachineConfig and then the pools naming it, and a rollout
	// updates pool status node by node.
	Debounce time.Duration
	// MaxDelay bounds how long a stream of changes may postpone a build
	// (default DefaultMaxDelay).
	MaxDelay time.Duration
}

// Scheme returns a scheme with the machineconfiguration.openshift.io/v1
// types, the only ones Watch reads.
func Scheme() *kruntime.Scheme {
	s := kruntime.NewScheme()
	if err := mcfgv1.AddToScheme(s); err != nil {
		panic(err) // static registration: cannot fail
	}
	return s
}

// Watch keeps informer caches of the cluster's MachineConfigPools,
// MachineConfigs and the ControllerConfig ControllerConfigName, and hands
// render.Inputs built from them to o.OnInputs, until ctx ends.
//
// The first Inputs are built as soon as all three caches have synced (an
// empty cluster gives empty Inputs: no pool). After that, any add, update
// or delete starts a quiet period of o.Debounce, extended by each further
// event up to o.MaxDelay after the first; then Inputs are built again —
// but handed on only if something the renderer reads changed: a
// MachineConfig's or the ControllerConfig's resourceVersion, a pool
// appearing or going, or a pool's spec, labels, annotations,
// status.configuration or whether status.updatedMachineCount > 0 (what
// decides between spec and status, as the MCS does). Machine counts and
// conditions moving during a rollout therefore cost nothing.
//
// Objects are handed over with apiVersion and kind set, as the MCO's
// bootstrap files have them, because the full tier serialises the served
// MachineConfig; informer caches, like typed clients, leave them empty.
// managedFields are kept: the in-cluster MCS serialises the MachineConfig
// with them too.
//
// Watch returns nil when ctx ends, or an error if the caches cannot be set
// up or do not sync (e.g. the CRDs are not installed, or RBAC forbids
// listing them: see the package documentation for the RBAC it needs).
func Watch(ctx context.Context, cfg *rest.Config, o WatchOptions) error {
	if o.OnInputs == nil {
		return errors.New("cluster: WatchOptions.OnInputs is required")
	}
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	if o.MaxDelay < o.Debounce {
		o.MaxDelay = max(DefaultMaxDelay, o.Debounce)
	}
	report := func(err error) {
		if o.OnError != nil && err != nil {
			o.OnError(err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := cache.New(rest.CopyConfig(cfg), cache.Options{
		Scheme: Scheme(),
		ByObject: map[client.Object]cache.ByObject{
			&mcfgv1.ControllerConfig{}: {Field: fields.OneTermEqualSelector("metadata.name", ControllerConfigName)},
		},
		DefaultWatchErrorHandler: func(wctx context.Context, r *toolscache.Reflector, err error) {
			if ctx.Err() == nil {
				report(fmt.Errorf("cluster: watch %s: %w", r.TypeDescription(), err))
			}
		},
	})
	if err != nil {
		return fmt.Errorf("cluster: informer cache: %w", err)
	}
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	for _, obj := range []client.Object{&mcfgv1.MachineConfigPool{}, &mcfgv1.MachineConfig{}, &mcfgv1.ControllerConfig{}} {
		inf, err := c.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("cluster: informer for %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("cluster: informer for %T: %w", obj, err)
		}
	}
	startErr := make(chan error, 1)
	go func() { startErr <- c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		cancel()
		err := <-startErr
		if ctx.Err() != nil && err == nil {
			return nil
		}
		return fmt.Errorf("cluster: caches did not sync: %v", err)
	}

	var (
		last  string
		built bool // an empty cluster's fingerprint is "" too
	)
	build := func() {
		in, fp, err := buildInputs(ctx, c)
		if err != nil {
			report(err)
			return
		}
		if built && fp == last {
			return
		}
		last, built = fp, true
		o.OnInputs(in)
	}
	// Events of the initial lists arrived before the sync: they are in
	// this first build.
	select {
	case <-changed:
	default:
	}
	build()

	var (
		quiet, deadline *time.Timer
		quietC, deadC   <-chan time.Time
	)
	stop := func() {
		if quiet != nil {
			quiet.Stop()
			deadline.Stop()
		}
		quiet, deadline, quietC, deadC = nil, nil, nil, nil
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			<-startErr
			return nil
		case err := <-startErr:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("cluster: informer cache stopped: %v", err)
		case <-changed:
			if quiet == nil {
				quiet, deadline = time.NewTimer(o.Debounce), time.NewTimer(o.MaxDelay)
				quietC, deadC = quiet.C, deadline.C
			} else {
				quiet.Reset(o.Debounce)
			}
		case <-quietC:
			stop()
			build()
		case <-deadC:
			stop()
			build()
		}
	}
}

// buildInputs lists the caches and returns Inputs and their fingerprint.
func buildInputs(ctx context.Context, c cache.Cache) (*render.Inputs, string, error) {
	// The cache's objects are read, not copied (NewInputs deep-copies):
	// the lists' items are shallow copies, whose TypeMeta may be set.
	noCopy := client.UnsafeDisableDeepCopy
	var pools mcfgv1.MachineConfigPoolList
	var mcs mcfgv1.MachineConfigList
	var ccs mcfgv1.ControllerConfigList
	for _, l := range []client.ObjectList{&pools, &mcs, &ccs} {
		if err := c.List(ctx, l, noCopy); err != nil {
			return nil, "", fmt.Errorf("cluster: list %T: %w", l, err)
		}
	}
	gv := mcfgv1.GroupVersion.String()
	var fp []string
	poolPtrs := make([]*mcfgv1.MachineConfigPool, len(pools.Items))
	for i := range pools.Items {
		p := &pools.Items[i]
		p.APIVersion, p.Kind = gv, "MachineConfigPool"
		poolPtrs[i] = p
		fp = append(fp, "pool "+p.Name+" "+poolFingerprint(p))
	}
	mcPtrs := make([]*mcfgv1.MachineConfig, len(mcs.Items))
	for i := range mcs.Items {
		m := &mcs.Items[i]
		m.APIVersion, m.Kind = gv, "MachineConfig"
		mcPtrs[i] = m
		fp = append(fp, "mc "+m.Name+" "+m.ResourceVersion)
	}
	var cc *mcfgv1.ControllerConfig
	for i := range ccs.Items {
		if ccs.Items[i].Name == ControllerConfigName {
			cc = &ccs.Items[i]
			cc.APIVersion, cc.Kind = gv, "ControllerConfig"
			fp = append(fp, "cc "+cc.ResourceVersion)
		}
	}
	in, err := render.NewInputs(poolPtrs, mcPtrs, cc)
	if err != nil {
		return nil, "", fmt.Errorf("cluster: %w", err)
	}
	sort.Strings(fp)
	return in, strings.Join(fp, "\n"), nil
}

// poolFingerprint covers what mcs/render reads of a pool (servedConfigName,
// publicSources) and what the full tier serialises of it (nothing): spec,
// labels, annotations, status.configuration and whether any machine runs
// spec's config. Keep it in step with mcs/render.
func poolFingerprint(p *mcfgv1.MachineConfigPool) string {
	b, err := json.Marshal(struct {
		Spec        mcfgv1.MachineConfigPoolSpec                `json:"spec"`
		Labels      map[string]string                           `json:"labels"`
		Annotations map[string]string                           `json:"annotations"`
		Status      mcfgv1.MachineConfigPoolStatusConfiguration `json:"status"`
		Updated     bool                                        `json:"updated"`
	}{p.Spec, p.Labels, p.Annotations, p.Status.Configuration, p.Status.UpdatedMachineCount > 0})
	if err != nil {
		// Cannot happen for these types; fall back to "always changed".
		return p.ResourceVersion
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
