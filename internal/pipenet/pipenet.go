package pipenet

import (
	"context"
	"errors"
	"net"
	"sync"
)

// Network is a set of listeners by address. A dial to an address connects
// to the listener of that name; an unknown or closed one is refused. The
// zero Network is empty and ready; its methods may be called concurrently.
type Network struct {
	mu  sync.Mutex
	lns map[string]*Listener // guarded by mu
}

// Listener is a [net.Listener] on a Network. Accept and Close may be
// called concurrently.
type Listener struct {
	addr  addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

type addr string

func (a addr) Network() string { return "pipe" }
func (a addr) String() string  { return string(a) }

// Listen returns a listener at address, "host:port" as a client dials it,
// in place of any listener there before.
func (n *Network) Listen(address string) *Listener {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lns == nil {
		n.lns = map[string]*Listener{}
	}
	l := &Listener{addr: addr(address), conns: make(chan net.Conn), done: make(chan struct{})}
	n.lns[address] = l
	return l
}

// DialContext connects to the listener at address once it accepts; it
// has the signature of [net.Dialer.DialContext], for an
// [net/http.Transport]. The network is ignored.
func (n *Network) DialContext(ctx context.Context, _, address string) (net.Conn, error) {
	n.mu.Lock()
	l := n.lns[address]
	n.mu.Unlock()
	if l == nil {
		return nil, refused()
	}
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, refused()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func refused() error {
	return &net.OpError{Op: "dial", Net: "pipe", Err: errors.New("connection refused")}
}

// Accept waits for a dial, or for Close.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept; later dials are refused. Connections already made
// stay open.
func (l *Listener) Close() error { l.once.Do(func() { close(l.done) }); return nil }

// Addr is the address the listener was made with.
func (l *Listener) Addr() net.Addr { return l.addr }
