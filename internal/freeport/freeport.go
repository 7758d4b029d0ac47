// Package freeport hands tests and demos TCP ports that nothing running
// beside them takes by accident: ports below the kernel's range of
// ephemeral ports (net.ipv4.ip_local_port_range). A port the kernel hands
// out for ":0" is in that range, and so is the source port of every
// outgoing connection; a port a test gives up for a moment (a process
// that binds it later, a proxy that closes its socket to look like a
// server that is down) can be taken there by any other test's ":0" or
// connection, as a kube-apiserver of a concurrent test once took a fault
// proxy's port during its outage. Below the range only another caller
// choosing a port explicitly can collide, and callers draw at random.
package freeport

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Listen listens on host (an address, "" for every one) at a random port
// below the ephemeral range.
func Listen(host string) (net.Listener, error) {
	lo, hi := bounds()
	var err error
	for range 1000 {
		p := lo + rand.IntN(hi-lo)
		if reserved(p) {
			continue
		}
		var ln net.Listener
		if ln, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p))); err == nil {
			return ln, nil
		}
	}
	return nil, errors.New("freeport: no free port below the ephemeral range: " + err.Error())
}

// Pairs returns n ports free now on every address, each with the next one
// free too (swtpm takes two), below the ephemeral range.
func Pairs(n int) ([]int, error) {
	lo, hi := bounds()
	var out []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for attempt := 0; len(out) < n && attempt < 1000*n; attempt++ {
		p := lo + rand.IntN(hi-lo-1)
		if reserved(p) || reserved(p+1) {
			continue
		}
		a, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", ":"+strconv.Itoa(p+1))
		if err != nil {
			a.Close()
			continue
		}
		held = append(held, a, b)
		out = append(out, p)
	}
	if len(out) < n {
		return nil, errors.New("freeport: not enough free port pairs below the ephemeral range")
	}
	return out, nil
}

// One is a loopback port free a moment ago, below the ephemeral range, for
// a process that takes its port as a flag.
func One() (int, error) {
	ln, err := Listen("127.0.0.1")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// reserved reports the Machine Config Server's own ports (22623 TLS,
// 22624 plain, 22625 metrics on OpenShift), which nodeproof's commands
// treat as what they are (a pointer config refuses https on 22624): a
// test's random port must not be one.
func reserved(p int) bool { return p >= 22623 && p <= 22625 }

// bounds is [20000, the first ephemeral port), or [1024, it) when that
// leaves fewer than 1000 ports.
func bounds() (lo, hi int) {
	hi = ephemeralLow()
	if hi-20000 < 1000 {
		return 1024, hi
	}
	return 20000, hi
}

// ephemeralLow is the first port the kernel hands out for outgoing
// connections and ":0" (32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low < 2048 {
		return 32768
	}
	return low
}
