// Package reload is the servers' periodic reread, written once: a pass
// every interval until the context ends (Every, or Now for a first pass at
// once), and Refusals, which says each distinct refusal of a reread once,
// not at every pass, and notices the recovery.
//
// It stands on the ground floor: it imports nothing of nodeproof, and the
// passes (mcs/serve, mcs/cluster, mcs/dirsource) bring their own logs.
package reload

import (
	"context"
	"sync"
	"time"
)

// Every calls pass every d, the first time after d, until ctx ends
// (no pass starts after ctx ends).
func Every(ctx context.Context, d time.Duration, pass func(context.Context)) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if ctx.Err() != nil {
			return // a tick and the end together: no pass
		}
		pass(ctx)
	}
}

// Now calls pass at once and then every d until ctx ends.
func Now(ctx context.Context, d time.Duration, pass func(context.Context)) {
	pass(ctx)
	Every(ctx, d, pass)
}

// Refusals remembers the last refusal said, so that a reread failing the
// same way at every pass is said once. The zero value is ready; it is safe
// for concurrent use.
type Refusals struct {
	mu   sync.Mutex
	last string // the last refusal said; "" after a success
}

// Note records one pass's outcome: say is true when err is a refusal not
// said since the last success (the caller logs it), recovered when err is
// nil after a refusal was said.
func (r *Refusals) Note(err error) (say, recovered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		recovered = r.last != ""
		r.last = ""
		return false, recovered
	}
	say = err.Error() != r.last
	r.last = err.Error()
	return say, false
}

// Forget clears the last refusal, as a success does: the next refusal is
// said even when it is the same as the last.
func (r *Refusals) Forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = ""
}
