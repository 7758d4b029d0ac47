// Package limit holds the server's admission limits, the answer to an
// unauthenticated network that may flood it:
//
//   - Buckets: token buckets per key (a source address, an identity), with
//     memory bounded however many keys an attacker makes up;
//   - Listener: a cap on concurrent connections and on the rate of new
//     connections per source address, enforced at accept, before any TLS
//     work is spent on the connection (and, behind mcs/proxied, before
//     any byte of an unlisted peer's connection is read);
//   - Gate: a cap on expensive requests in flight, with a bounded wait.
//
// Everything takes a clock; nothing logs (callers read the counters).
package limit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Rate is a token bucket's refill rate and size. A zero PerSecond turns
// the limit off.
type Rate struct {
	PerSecond float64
	Burst     int
}

// On reports whether the rate limits anything.
func (r Rate) On() bool { return r.PerSecond > 0 }

// DefaultMaxKeys bounds how many keys a Buckets tracks (about 100 bytes
// each).
const DefaultMaxKeys = 1 << 16

// Buckets is a token bucket per key. Safe for concurrent use.
type Buckets struct {
	r       Rate
	maxKeys int
	clock   func() time.Time

	mu        sync.Mutex
	m         map[string]*rate.Limiter
	lastSweep time.Time
	refused   atomic.Uint64
}

// NewBuckets returns buckets of rate r for at most maxKeys keys at once
// (0: DefaultMaxKeys). A nil *Buckets, or one with r off, allows
// everything.
func NewBuckets(r Rate, maxKeys int, clock func() time.Time) *Buckets {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	if r.Burst < 1 {
		r.Burst = 1
	}
	return &Buckets{r: r, maxKeys: maxKeys, clock: clock, m: map[string]*rate.Limiter{}}
}

// Allow takes a token from key's bucket. When there is none it returns
// false and how long until there will be one.
//
// Memory stays bounded: when maxKeys keys are tracked, buckets that are
// full again (their key has been quiet long enough to have forgotten it)
// are dropped; if none can be dropped, a new key is refused (fail closed:
// an attacker spraying keys must not get fresh buckets) until some can.
func (b *Buckets) Allow(key string) (bool, time.Duration) {
	_, ok, wait := b.Reserve(1, key)
	return ok, wait
}

// Reserve takes n tokens from the bucket of each of keys, all or none
// (one request counted against its source and its target, say). When
// every bucket has them, it returns a function that gives them back, for
// a caller whose next limit refused the request; otherwise it takes
// nothing and says how long until every bucket would have them. n above
// the burst never fits (wait: a minute). Keys are tracked as Allow's are.
func (b *Buckets) Reserve(n int, keys ...string) (undo func(), ok bool, wait time.Duration) {
	if b == nil || !b.r.On() {
		return func() {}, true, 0
	}
	now := b.clock()
	b.mu.Lock()
	defer b.mu.Unlock()
	rs := make([]*rate.Reservation, 0, len(keys))
	cancel := func() {
		for i := len(rs) - 1; i >= 0; i-- {
			rs[i].CancelAt(now) // at the reservation's own time: every token comes back
		}
	}
	for _, key := range keys {
		l, ok := b.m[key]
		if !ok {
			if len(b.m) >= b.maxKeys {
				b.sweep(now)
			}
			if len(b.m) >= b.maxKeys {
				wait = max(wait, time.Second)
				continue
			}
			l = rate.NewLimiter(rate.Limit(b.r.PerSecond), b.r.Burst)
			b.m[key] = l
		}
		r := l.ReserveN(now, n)
		if !r.OK() {
			wait = max(wait, time.Minute)
			continue
		}
		rs = append(rs, r)
		wait = max(wait, r.DelayFrom(now))
	}
	if wait > 0 {
		cancel()
		b.refused.Add(1)
		return nil, false, wait
	}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		cancel()
	}, true, 0
}

// sweep drops full buckets, at most once a second (b.mu held).
func (b *Buckets) sweep(now time.Time) {
	if now.Sub(b.lastSweep) < time.Second {
		return
	}
	b.lastSweep = now
	for k, l := range b.m {
		if l.TokensAt(now) >= float64(b.r.Burst) {
			delete(b.m, k)
		}
	}
}

// Refused counts the tokens refused so far.
func (b *Buckets) Refused() uint64 {
	if b == nil {
		return 0
	}
	return b.refused.Load()
}

// Len is how many keys are tracked.
func (b *Buckets) Len() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

// SourceKey is the key of a peer address: the IPv4 address, or the /64 of
// an IPv6 address (one host can use a whole /64). IPv4-mapped IPv6
// addresses count as IPv4. An address that does not parse is its own key.
func SourceKey(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64)
	return p.String()
}
