package main

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultProxy is a fault-injecting TCP proxy for the end-to-end fault tests:
// it stands between effectline and one dependency (PostgreSQL, the broker,
// the tool) and can add latency, cut every connection at once, and refuse
// new connections for a while.
//
// It is written here rather than taken from toxiproxy: the three knobs the
// tests need fit in a page, and toxiproxy's server would pull a sizable
// dependency tree (and a go.mod change other engineers' work would have to
// merge with) into the module for tests alone.
type faultProxy struct {
	t    testing.TB
	addr string // the address clients dial; stable across Refuse

	mu       sync.Mutex
	ln       net.Listener
	upstream string
	latency  time.Duration
	conns    map[net.Conn]bool // true for the client side of a pair
	closed   bool
	wg       sync.WaitGroup

	accepted atomic.Int64
	cut      atomic.Int64
}

// newFaultProxy listens on a random loopback port and forwards to upstream,
// which may be set later with setUpstream (the broker's listener exists only
// once kfake creates it). It is closed when the test finishes.
func newFaultProxy(t testing.TB, upstream string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &faultProxy{t: t, addr: ln.Addr().String(), ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// Addr is the address clients dial.
func (p *faultProxy) Addr() string { return p.addr }

func (p *faultProxy) setUpstream(addr string) {
	p.mu.Lock()
	p.upstream = addr
	p.mu.Unlock()
}

// setLatency delays every chunk forwarded, in both directions, by d.
func (p *faultProxy) setLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// cutAll closes every connection through the proxy now, both sides, as a
// crashed middlebox or a restarted server would. It returns how many client
// connections it cut.
func (p *faultProxy) cutAll() int {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	clients := 0
	for c, client := range p.conns {
		conns = append(conns, c)
		if client {
			clients++
		}
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	p.cut.Add(int64(clients))
	return clients
}

// active returns how many client connections are open through the proxy.
func (p *faultProxy) active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, client := range p.conns {
		if client {
			n++
		}
	}
	return n
}

// cutWhenActive waits up to d for a connection to be open, then cuts all:
// for a dependency whose connections are short-lived (an HTTP tool without
// keep-alives), a cut at a random moment would usually find none.
func (p *faultProxy) cutWhenActive(d time.Duration) int {
	deadline := time.Now().Add(d)
	for p.active() == 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	return p.cutAll()
}

// refuse closes the listener for d, so new connections are refused
// (ECONNREFUSED) as by a server that is down, then listens again on the same
// address. Established connections are left alone; cut them with cutAll.
func (p *faultProxy) refuse(d time.Duration) {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	time.Sleep(d)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	var err error
	for range 50 { // the port is ours, but the kernel may lag a moment
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Errorf("proxy: listening again on %s: %v", p.addr, err)
		return
	}
	p.ln = ln
	p.wg.Add(1)
	go p.serve(ln)
}

func (p *faultProxy) close() {
	p.mu.Lock()
	p.closed = true
	ln := p.ln
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	p.cutAll()
	p.wg.Wait()
}

func (p *faultProxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.handle(c)
	}
}

// track registers c, or reports false when the proxy is closing.
func (p *faultProxy) track(c net.Conn, client bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = client
	return true
}

func (p *faultProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *faultProxy) handle(client net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	upstream := p.upstream
	p.mu.Unlock()
	if !p.track(client, true) {
		_ = client.Close()
		return
	}
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", upstream, 5*time.Second)
	if err != nil {
		return // the client sees the connection close: the upstream is down
	}
	if !p.track(server, false) {
		_ = server.Close()
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	// One direction ending (EOF or a cut) ends the pair: a half-open
	// connection would only hide the fault from the other side.
	<-done
	_ = client.Close()
	_ = server.Close()
	<-done
}

// pipe copies src to dst chunk by chunk, each delayed by the latency.
func (p *faultProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			d := p.latency
			p.mu.Unlock()
			if d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a cut: handle closes both sides
		}
	}
}

// faultAdvertisedListener is a listener whose Addr is another address: kfake
// advertises its listener's address to clients in metadata, so wrapping it
// makes clients reconnect through the proxy rather than around it.
type faultAdvertisedListener struct {
	net.Listener
	addr net.Addr
}

func (l faultAdvertisedListener) Addr() net.Addr { return l.addr }
