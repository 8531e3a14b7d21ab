package bus_test

import (
	"bytes"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
)

// cutProxy stands between clients and a server, forwarding what each side
// sends, and cuts a client's connection when told to: the next time the
// client sends what a pattern matches, the proxy drops it and closes the
// connection, as a network or a server that goes away with a request in
// flight does; or the next time the server sends what it matches
// (cutOnDelivery). The client reconnects through the proxy; the request's
// answer, or the message, never comes. hold cuts every connection at once
// and refuses new ones until release.
type cutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   []byte        // armed pattern, nil when disarmed
	down  bool          // the armed pattern is of what the server sends
	held  bool          // connections are refused: the server is away
	fired chan struct{} // closed when the armed cut is made
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newCutProxy returns a proxy to the server at target (host:port),
// closed when the test ends.
func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// throughCutProxy connects agent and an operator to s through a new
// cutProxy, on connections of their own that reconnect at once.
func throughCutProxy(t *testing.T, s *embedded.Server, agent string) (*cutProxy, *bus.Bus, *bus.Admin) {
	t.Helper()
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	b := dialBus(t, p.URL(), agent)
	a, err := bus.ConnectAdmin(p.URL(), bus.WithNATSOptions(nats.ReconnectWait(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return p, b, a
}

// URL is the proxy's client URL.
func (p *cutProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// cutOn arms the proxy: the next client write that contains pattern is
// dropped and its connection closed. The returned channel is closed then.
// An empty pattern disarms it.
func (p *cutProxy) cutOn(pattern string) <-chan struct{} {
	return p.arm(pattern, false)
}

// cutOnDelivery is cutOn for what the server sends a client: the next
// write of the server's that contains pattern is dropped and the client's
// connection closed, as when the network goes with messages on their way.
func (p *cutProxy) cutOnDelivery(pattern string) <-chan struct{} {
	return p.arm(pattern, true)
}

func (p *cutProxy) arm(pattern string, down bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.down, p.fired = nil, down, make(chan struct{})
	if pattern != "" {
		p.cut = []byte(pattern)
	}
	return p.fired
}

// hold cuts every connection and refuses new ones until release, as a
// network down or a server away does.
func (p *cutProxy) hold() {
	p.mu.Lock()
	p.held = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// release ends hold: clients connect again.
func (p *cutProxy) release() {
	p.mu.Lock()
	p.held = false
	p.mu.Unlock()
}

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		held := p.held
		p.mu.Unlock()
		if held {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.forward(c, s, false) })
		p.wg.Go(func() { p.forward(s, c, true) })
	}
}

// forward copies what from sends to to, unless it matches the pattern
// armed for its direction: down for what the server sends.
func (p *cutProxy) forward(from, to net.Conn, down bool) {
	defer p.drop(from, to)
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			p.mu.Lock()
			hit := p.cut != nil && p.down == down && bytes.Contains(buf[:n], p.cut)
			if hit {
				p.cut = nil
				close(p.fired)
			}
			p.mu.Unlock()
			if hit {
				return
			}
			if _, err := to.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *cutProxy) drop(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
