package limit

import (
	"context"
	"sync/atomic"
	"time"
)

// Gate caps the expensive requests in flight (attestations: bodies of up
// to a few MiB, signature checks, store writes). A request waits up to a
// bounded time for a slot, so a burst of honest machines queues briefly
// instead of being turned away, and memory stays bounded by the cap
// whatever arrives. A nil *Gate admits everything.
type Gate struct {
	slots   chan struct{}
	wait    time.Duration
	refused atomic.Uint64
}

// NewGate admits n requests at once; others wait up to wait for a slot.
// n <= 0 returns nil (no cap).
func NewGate(n int, wait time.Duration) *Gate {
	if n <= 0 {
		return nil
	}
	return &Gate{slots: make(chan struct{}, n), wait: wait}
}

// Enter waits for a slot until the gate's wait or ctx ends. It returns a
// function that gives the slot back, or nil if no slot was free in time.
func (g *Gate) Enter(ctx context.Context) (leave func()) {
	if g == nil {
		return func() {}
	}
	select {
	case g.slots <- struct{}{}:
		return g.leave
	default:
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return g.leave
	case <-t.C:
	case <-ctx.Done():
	}
	g.refused.Add(1)
	return nil
}

func (g *Gate) leave() { <-g.slots }

// InFlight is how many requests hold a slot.
func (g *Gate) InFlight() int {
	if g == nil {
		return 0
	}
	return len(g.slots)
}

// Refused counts requests that found no slot in time.
func (g *Gate) Refused() uint64 {
	if g == nil {
		return 0
	}
	return g.refused.Load()
}
