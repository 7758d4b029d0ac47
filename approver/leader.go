package approver

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderOptions configure leader election on a coordination.k8s.io Lease.
type LeaderOptions struct {
	Client    kubernetes.Interface
	Namespace string // the Lease's namespace (required)
	Name      string // the Lease's name (default "nodeproof-approver")
	Identity  string // this replica (required; e.g. the pod name)
	// Lease timing (defaults 15 s, 10 s, 2 s: client-go's usual values).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnNewLeader, if set, hears who leads.
	OnNewLeader func(identity string)
}

// ErrLostLease is returned by RunLeader when this replica stopped leading
// before ctx ended: the process should exit so its caches are not used by
// a replica that no longer owns the work.
var ErrLostLease = errors.New("approver: lost the leader lease")

// RunLeader runs run while this replica holds the Lease, and returns when
// ctx ends (nil; the Lease is released) or the Lease is lost
// (ErrLostLease). Two replicas never run run at once while their clocks
// agree within the lease's margins (client-go leader election).
func RunLeader(ctx context.Context, o LeaderOptions, run func(context.Context)) error {
	if o.Client == nil || o.Namespace == "" || o.Identity == "" {
		return errors.New("approver: LeaderOptions: Client, Namespace and Identity are required")
	}
	if o.Name == "" {
		o.Name = "nodeproof-approver"
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
		Client:     o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
	}
	// run runs here, not in client-go's goroutine, so RunLeader returns
	// only after it stopped.
	leading := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		ReleaseOnCancel: true,
		LeaseDuration:   o.LeaseDuration,
		RenewDeadline:   o.RenewDeadline,
		RetryPeriod:     o.RetryPeriod,
		Name:            o.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) { leading <- ctx },
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if o.OnNewLeader != nil {
					o.OnNewLeader(id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("approver: leader election: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		le.Run(ctx)
	}()
	select {
	case lctx := <-leading:
		run(lctx) // until the lease is lost or ctx ends
		<-done
	case <-done:
	}
	if ctx.Err() == nil {
		return ErrLostLease
	}
	return nil
}
