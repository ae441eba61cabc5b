package testenv

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestRefusedAddrRefusesAndCannotBeTaken: a connection to the address is
// refused, and a listener cannot bind it while the test runs.
func TestRefusedAddrRefusesAndCannotBeTaken(t *testing.T) {
	addr := RefusedAddr(t)
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s accepted a connection", addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialing %s: %v, want connection refused", addr, err)
	}
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatalf("a listener could bind %s", addr)
	}
}
