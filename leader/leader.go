// Package leader runs a replica's work only while it holds a
// coordination.k8s.io Lease (client-go leader election), and runs it
// afresh after every Lease it wins: a term is a function that gets a
// context ending with the term. The server's cluster-state keeper
// (mcs/cluster.Keeper) and the CSR approver (approver.Runner) lead this way.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Options configure leader election on a coordination.k8s.io Lease.
type Options struct {
	Client    kubernetes.Interface
	Namespace string // the Lease's namespace (required)
	Name      string // the Lease's name (required)
	Identity  string // this replica (required; e.g. the pod name)
	Role      string // what leads, for logs (default: Name): "approver", "server"
	// Lease timing (each zero one defaults to 15 s, 10 s, 2 s: client-go's
	// usual values; client-go requires LeaseDuration > RenewDeadline >
	// RetryPeriod).
	// A leader that cannot renew within RenewDeadline stops acting; another
	// replica may take the Lease LeaseDuration after its last renewal.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnNewLeader, if set, hears who leads.
	OnNewLeader func(identity string)
	// Log, if set, gets a line when a term starts and when one ends before
	// ctx (the Lease lost, or run returned early).
	Log *slog.Logger
}

// Run campaigns for the Lease and, each time this replica wins it,
// calls run with a context that ends when the term ends: when the Lease is
// lost (not renewed within RenewDeadline, e.g. while the API server is
// unreachable) or ctx ends. Run waits for run to return before it
// campaigns again, so the caller builds everything a term uses inside run
// (a fresh Controller, with its own informers, caches and queue) and drops
// it when run returns: a replica that lost the Lease stops acting at once
// and starts a new term from scratch in the same process, instead of
// exiting (which a Deployment would answer with a restart back-off).
//
// If run returns while the term is still on (run gave up), the Lease is
// released and Run campaigns again after RetryPeriod.
//
// Run returns only when ctx ends (nil; a Lease held is released) or
// when o is invalid. Two replicas never run run at once while their clocks
// agree within the lease's margins (client-go leader election); because a
// term's run may still be finishing a call when its Lease is lost, what run
// writes must tolerate a successor doing the same (the approver writes
// with the resourceVersion it read, and a record is consumed once).
func Run(ctx context.Context, o Options, run func(context.Context)) error {
	if o.Client == nil || o.Namespace == "" || o.Name == "" || o.Identity == "" {
		return errors.New("leader: Options: Client, Namespace, Name and Identity are required")
	}
	if o.Role == "" {
		o.Role = o.Name
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = 10 * time.Second
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = 2 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
		Client:     o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
	}
	for term := 1; ; term++ {
		led, err := campaign(ctx, o, lock, run, term)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if led {
			o.Log.Warn(o.Role+" stopped acting: the leader term ended before shutdown (lease lost or not renewed); caches dropped, campaigning again",
				"identity", o.Identity, "lease", o.Namespace+"/"+o.Name, "term", term)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.RetryPeriod):
		}
	}
}

// campaign runs one elector until it stops leading or ctx ends, and reports
// whether it led.
func campaign(ctx context.Context, o Options, lock resourcelock.Interface, run func(context.Context), term int) (bool, error) {
	// The elector's own context: cancelled when run returns, so a run that
	// gave up early releases the Lease (ReleaseOnCancel).
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	// run runs here, not in client-go's goroutine, so a term is over only
	// when run returned.
	leading := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		ReleaseOnCancel: true,
		LeaseDuration:   o.LeaseDuration,
		RenewDeadline:   o.RenewDeadline,
		RetryPeriod:     o.RetryPeriod,
		Name:            o.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) { leading <- lctx },
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if o.OnNewLeader != nil {
					o.OnNewLeader(id)
				}
			},
		},
	})
	if err != nil {
		return false, fmt.Errorf("leader: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		le.Run(ectx)
	}()
	select {
	case lctx := <-leading:
		o.Log.Info(o.Role+" leading", "identity", o.Identity, "lease", o.Namespace+"/"+o.Name, "term", term)
		run(lctx) // until the term ends
		cancel()
		<-done
		return true, nil
	case <-done:
		return false, nil
	}
}

// Identity is a replica's identity in a Lease: given (a flag), else
// $POD_NAME (the Deployment's downward API), else the host name.
func Identity(given string) (string, error) {
	if given != "" {
		return given, nil
	}
	if id := os.Getenv("POD_NAME"); id != "" {
		return id, nil
	}
	return os.Hostname()
}
