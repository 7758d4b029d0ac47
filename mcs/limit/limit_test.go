package limit

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestBuckets(t *testing.T) {
	type step struct {
		advance time.Duration
		key     string
		allowed bool
		// retry, when allowed is false: the wait Allow gives (±10 ms).
		retry time.Duration
	}
	cases := []struct {
		name    string
		rate    Rate
		maxKeys int
		steps   []step
	}{
		{"burst then refused with the time to the next token", Rate{PerSecond: 2, Burst: 3}, 0, []step{
			{0, "a", true, 0}, {0, "a", true, 0}, {0, "a", true, 0},
			{0, "a", false, 500 * time.Millisecond},
			{250 * time.Millisecond, "a", false, 250 * time.Millisecond},
			{250 * time.Millisecond, "a", true, 0},
		}},
		{"a refused request takes no token", Rate{PerSecond: 1, Burst: 1}, 0, []step{
			{0, "a", true, 0}, {0, "a", false, time.Second}, {0, "a", false, time.Second}, {0, "a", false, time.Second},
			{time.Second, "a", true, 0},
		}},
		{"keys are independent", Rate{PerSecond: 1, Burst: 1}, 0, []step{
			{0, "a", true, 0}, {0, "a", false, time.Second}, {0, "b", true, 0}, {0, "c", true, 0},
		}},
		{"off allows everything", Rate{}, 0, []step{
			{0, "a", true, 0}, {0, "a", true, 0}, {0, "a", true, 0},
		}},
		{"full table refuses new keys (fail closed)", Rate{PerSecond: 1, Burst: 1}, 2, []step{
			{0, "a", true, 0}, {0, "b", true, 0}, {0, "c", false, time.Second},
			// Both buckets refill: the sweep forgets them and c gets in.
			{2 * time.Second, "c", true, 0}, {0, "a", true, 0}, {0, "d", false, time.Second},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1e9, 0)}
			b := NewBuckets(tc.rate, tc.maxKeys, clk.now)
			for i, s := range tc.steps {
				clk.advance(s.advance)
				ok, retry := b.Allow(s.key)
				if ok != s.allowed {
					t.Fatalf("step %d (%s): allowed %v, want %v", i, s.key, ok, s.allowed)
				}
				if !ok && (retry < s.retry-10*time.Millisecond || retry > s.retry+10*time.Millisecond) {
					t.Fatalf("step %d (%s): retry after %s, want %s", i, s.key, retry, s.retry)
				}
			}
			if tc.maxKeys > 0 && b.Len() > tc.maxKeys {
				t.Fatalf("%d keys tracked, bound %d", b.Len(), tc.maxKeys)
			}
		})
	}
}

// TestReserve: n tokens from every key's bucket, or none; undo gives
// them back.
func TestReserve(t *testing.T) {
	type step struct {
		n       int
		keys    []string
		allowed bool
		undo    bool // give the tokens back at once
		retry   time.Duration
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"all keys pay", []step{
			{3, []string{"src", "name"}, true, false, 0},
			{2, []string{"src"}, true, false, 0},
			{1, []string{"src"}, false, false, time.Second},
			{2, []string{"name"}, true, false, 0},
		}},
		{"one key short: none pays", []step{
			{5, []string{"name"}, true, false, 0},
			{2, []string{"src", "name"}, false, false, 2 * time.Second}, // the longer wait of the two
			{5, []string{"src"}, true, false, 0},                        // src kept its tokens
		}},
		{"undo gives every token back", []step{
			{4, []string{"src", "name"}, true, true, 0},
			{5, []string{"src", "name"}, true, false, 0},
		}},
		{"more than the burst never fits", []step{
			{6, []string{"src"}, false, false, time.Minute},
			{5, []string{"src"}, true, false, 0},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1e9, 0)}
			b := NewBuckets(Rate{PerSecond: 1, Burst: 5}, 0, clk.now)
			for i, s := range tc.steps {
				undo, ok, retry := b.Reserve(s.n, s.keys...)
				if ok != s.allowed || (ok && undo == nil) {
					t.Fatalf("step %d (%d from %v): allowed %v, want %v", i, s.n, s.keys, ok, s.allowed)
				}
				if !ok && (retry < s.retry-10*time.Millisecond || retry > s.retry+10*time.Millisecond) {
					t.Fatalf("step %d: retry after %s, want %s", i, retry, s.retry)
				}
				if s.undo {
					undo()
				}
			}
		})
	}
	var nilB *Buckets
	if undo, ok, _ := nilB.Reserve(100, "a", "b"); !ok || undo == nil {
		t.Fatal("a nil Buckets limits Reserve")
	}
}

func TestNilBucketsAllow(t *testing.T) {
	var b *Buckets
	if ok, _ := b.Allow("x"); !ok || b.Refused() != 0 || b.Len() != 0 {
		t.Fatal("a nil Buckets limits")
	}
}

func TestSourceKey(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"IPv4 with port", "192.0.2.7:51234", "192.0.2.7"},
		{"IPv4 without port", "192.0.2.7", "192.0.2.7"},
		{"IPv4-mapped IPv6 is IPv4", "[::ffff:192.0.2.7]:443", "192.0.2.7"},
		{"IPv6 counts by /64", "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:1", "2001:db8:1:2::/64"},
		{"another host of the same /64", "[2001:db8:1:2::1]:9", "2001:db8:1:2::/64"},
		{"zone dropped", "[fe80::1%eth0]:1", "fe80::/64"},
		{"garbage is its own key", "not-an-address", "not-an-address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := SourceKey(tc.in); got != tc.want {
				t.Fatalf("SourceKey(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// dialFrom connects to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// alive reports whether the server side kept c open: a server that
// closed at accept makes the read end at once with EOF or a reset.
func alive(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return true
	}
	return false
}

func TestListener(t *testing.T) {
	cases := []struct {
		name string
		o    func(clock func() time.Time) ListenerOptions
		// from: the source address of each connection, in order; kept:
		// whether the listener keeps it.
		from []string
		kept []bool
	}{
		{"at most 2 open per source; another source unaffected",
			func(func() time.Time) ListenerOptions { return ListenerOptions{MaxConnsPerSource: 2} },
			[]string{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"},
			[]bool{true, true, false, true, true}},
		{"new connections per source: burst 2, then refused",
			func(clock func() time.Time) ListenerOptions {
				return ListenerOptions{NewConns: NewBuckets(Rate{PerSecond: 0.001, Burst: 2}, 0, clock)}
			},
			[]string{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.3"},
			[]bool{true, true, false, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := NewListener(raw, tc.o(time.Now))
			defer ln.Close()
			accepted := make(chan net.Conn, 16)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					accepted <- c
				}
			}()
			refused := 0
			for i, src := range tc.from {
				c := dialFrom(t, src, raw.Addr().String())
				if got := alive(c); got != tc.kept[i] {
					t.Fatalf("connection %d from %s: kept %v, want %v", i, src, got, tc.kept[i])
				}
				if !tc.kept[i] {
					refused++
				}
			}
			if got := ln.Refused(); got != uint64(refused) {
				t.Fatalf("Refused() = %d, want %d", got, refused)
			}
			// Closing a kept connection gives its slot back.
			for len(accepted) > 0 {
				(<-accepted).Close()
			}
			if n := ln.Open("127.0.0.1"); n != 0 {
				t.Fatalf("%d connections still counted after all were closed", n)
			}
		})
	}
}

func TestListenerCloseTwiceGivesOneSlot(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewListener(raw, ListenerOptions{MaxConnsPerSource: 1})
	defer ln.Close()
	go func() {
		c1 := dialFrom(t, "127.0.0.1", raw.Addr().String())
		io.Copy(io.Discard, c1)
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	c.Close()
	if n := ln.Open("127.0.0.1"); n != 0 {
		t.Fatalf("open = %d after a double close, want 0", n)
	}
}

func TestGate(t *testing.T) {
	g := NewGate(2, 50*time.Millisecond)
	l1, l2 := g.Enter(context.Background()), g.Enter(context.Background())
	if l1 == nil || l2 == nil || g.InFlight() != 2 {
		t.Fatal("two slots not given")
	}
	if g.Enter(context.Background()) != nil {
		t.Fatal("a third request entered a gate of two")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if g.Enter(ctx) != nil {
		t.Fatal("entered with a cancelled context and no free slot")
	}
	if g.Refused() != 2 {
		t.Fatalf("Refused() = %d, want 2", g.Refused())
	}
	// A waiter gets the slot given back within its wait.
	got := make(chan func(), 1)
	g2 := NewGate(1, 5*time.Second)
	leave := g2.Enter(context.Background())
	go func() { got <- g2.Enter(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	leave()
	if l := <-got; l == nil {
		t.Fatal("the waiter did not get the freed slot")
	}
	l1()
	l2()
	if g.InFlight() != 0 {
		t.Fatalf("InFlight() = %d after both left", g.InFlight())
	}
	var none *Gate
	if none.Enter(context.Background()) == nil {
		t.Fatal("a nil gate refused")
	}
}
