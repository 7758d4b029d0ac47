package freeport

import (
	"net"
	"testing"
)

// TestBelowEphemeral: every port handed out lies below the kernel's
// ephemeral range and is bindable (Pairs: with its neighbour) on every
// address; a listener from Listen is open on the host asked for.
func TestBelowEphemeral(t *testing.T) {
	_, hi := bounds()
	ln, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a := ln.Addr().(*net.TCPAddr)
	if !a.IP.Equal(net.IPv4(127, 0, 0, 1)) || a.Port >= hi {
		t.Errorf("Listen: %s, want 127.0.0.1 below port %d", a, hi)
	}
	if _, err := net.Dial("tcp", a.String()); err != nil {
		t.Errorf("dial the listener: %v", err)
	}
	ports, err := Pairs(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if p >= hi-1 {
			t.Errorf("pair at %d, not below %d", p, hi)
		}
	}
	p, err := One()
	if err != nil {
		t.Fatal(err)
	}
	if p >= hi {
		t.Errorf("One: %d, not below %d", p, hi)
	}
}
