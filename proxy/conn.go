package proxy

import (
	"context"
	"io"
	"net"
)

// bodyConn is a connection to a backend that sends a held request body
// (see [heldReader]) in one write. net/http's transport copies a body of
// known length through io.LimitReader, which hides the body's WriteTo,
// into the connection's ReadFrom; a TCP connection's ReadFrom then copies
// it through a 32 KB buffer, one write call each: seven for a 220 KB
// prompt, each a system call that copies and wakes the backend.
type bodyConn struct{ net.Conn }

// ReadFrom sends a held body whole, within the limit around it; anything
// else goes to the connection's own ReadFrom (TCP's splices and sends
// files) or through io.Copy.
func (c bodyConn) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if hr, ok := lr.R.(*heldReader); ok && hr.size() <= lr.N {
			n, err := hr.WriteTo(c.Conn)
			lr.N -= n
			return n, err
		}
	}
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// dialBodyConn wraps dial's connections in [bodyConn].
func dialBodyConn(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return bodyConn{c}, nil
	}
}
