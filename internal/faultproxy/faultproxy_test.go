package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echo serves lines back until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, line string) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestCutAndRestore(t *testing.T) {
	p := New(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello"); err != nil || got != "hello\n" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	p.Cut()
	if _, err := roundTrip(c, "after cut"); err == nil {
		t.Fatal("a connection open before Cut still carries data")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial during the cut: %v, want connection refused", err)
	}

	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial after Restore: %v", err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2, "again"); err != nil || got != "again\n" {
		t.Fatalf("after Restore: %q, %v", got, err)
	}
}

// TestCutAfter: the armed connection passes exactly n bytes from the server
// and is then closed; the next connection is whole.
func TestCutAfter(t *testing.T) {
	p := New(t, echo(t))
	p.CutAfter(10)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "0123456789abcdefghij\n"); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if string(got) != "0123456789" {
		t.Fatalf("the cut connection passed %q (%v); want the first 10 bytes", got, err)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if line, err := roundTrip(c2, "0123456789abcdefghij"); err != nil || line != "0123456789abcdefghij\n" {
		t.Fatalf("the next connection: %q %v", line, err)
	}
}
