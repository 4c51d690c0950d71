package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bounds of the derived proxy.max_reading_connections: a quarter of the
// descriptor limit leaves three quarters to requests in flight (two
// descriptors each, the client's and the backend's), the backends' idle
// pools, scrapes, KV-event sockets and the admin listener. Past 16384 the
// cap guards memory rather than descriptors: each waiting connection holds
// a goroutine and its read and write buffers, some 20 KB.
const (
	readingShare      = 4
	maxDerivedReading = 16384
)

// Shedder bounds the client connections the proxy is waiting on by
// [Config.MaxReadingConnections]: new connections that have not sent a
// whole request (headers, or a body not all in) and keep-alive connections
// idle between requests. A client holding many of them open, each sending
// nothing, would otherwise take every file descriptor the process may
// open, and then real requests fail: their connections are not accepted,
// their backends cannot be dialled (issue 44).
//
// Past the bound, the waiting connection silent longest is closed: the one
// whose last byte arrived longest ago or, if idle, whose last answer ended
// longest ago (the oldest among equals). A stalled reader goes before a
// client still sending and a new connection goes last, so that slow and
// idle clients make room for real ones, much as nginx reuses idle
// keep-alive connections when it runs out; a client reopens a keep-alive
// connection for the cost of a handshake. A connection whose request is in
// flight (its body read, its answer being proxied or streamed) is not
// counted and never closed. When an accept fails for want of a descriptor
// anyway (EMFILE or ENFILE), the longest silent waiting connection is
// closed too, and net/http's accept loop retries after its backoff (5 ms
// doubling to 1 s) rather than spinning.
//
// The connections are counted by the listener [Shedder.Listener] returns
// and by hooks of [Server.HTTPServer]'s server, so a Shedder works with
// the server that method returns. Its methods may be called concurrently.
type Shedder struct {
	// immutable after NewShedder
	max    int
	epoch  time.Time
	logger *slog.Logger
	shed   [2][2]prometheus.Counter // [reason][state]

	mu       sync.Mutex
	waiting  []*trackedConn // guarded by mu; each at its index
	seq      uint64         // guarded by mu; connections accepted
	lastWarn time.Time      // guarded by mu; of the last descriptor warning
}

// The labels of llmlb_connections_shed_total.
const (
	shedCap, shedDescriptors = 0, 1 // reason
	stateReading, stateIdle  = 0, 1 // state
)

// NewShedder returns a Shedder bounding the waiting connections by
// cfg.MaxReadingConnections, or when it is 0 by a quarter of the file
// descriptor limit the process has now (RLIMIT_NOFILE; Go raises the soft
// limit to the hard one at start), at most 16384. Its counter is
// registered on reg; logger (nil: none) warns when descriptors run out.
func NewShedder(cfg Config, reg prometheus.Registerer, logger *slog.Logger) *Shedder {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sh := &Shedder{max: cfg.MaxReadingConnections, epoch: time.Now(), logger: logger}
	if sh.max == 0 {
		sh.max = maxDerivedReading
		if n, ok := descriptorLimit(); ok {
			sh.max = int(max(min(n/readingShare, maxDerivedReading), 1))
		}
	}
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmlb_connections_shed_total",
		Help: "Client connections closed under descriptor pressure, by reason (cap: proxy.max_reading_connections reached; descriptors: an accept found no free file descriptor) and by what the connection was doing (reading: sending a request; idle: a keep-alive connection between requests).",
	}, []string{"reason", "state"})
	for r, reason := range []string{"cap", "descriptors"} {
		for s, state := range []string{"reading", "idle"} {
			sh.shed[r][s] = shed.WithLabelValues(reason, state)
		}
	}
	reg.MustRegister(shed)
	return sh
}

// Max returns the bound on waiting connections in force.
func (sh *Shedder) Max() int { return sh.max }

// Listener returns ln with its connections counted by sh. Wrap the TCP
// listener, under any TLS one, so that handshakes count as bytes sent.
func (sh *Shedder) Listener(ln net.Listener) net.Listener { return &shedListener{ln, sh} }

type shedListener struct {
	net.Listener
	sh *Shedder
}

// Accept returns the next connection, counted as waiting. An accept that
// fails for want of a descriptor closes the longest silent waiting
// connection, so that the retry net/http makes after its backoff finds one
// free.
func (l *shedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			l.sh.outOfDescriptors(err)
		}
		return nil, err // a temporary error: net/http backs off and retries
	}
	return l.sh.track(c), nil
}

// trackedConn is a client connection a [Shedder] counts.
type trackedConn struct {
	net.Conn
	sh  *Shedder
	seq uint64 // immutable: accept order, the tie-break

	// atomic
	last atomic.Int64 // since sh.epoch: the last byte received, or the start of idleness
	idle atomic.Bool  // between requests, no byte of the next one yet

	// guarded by sh.mu
	idx    int  // in sh.waiting; -1 when not waiting
	closed bool // closed, by the server or for pressure
}

// Read notes when a byte arrived.
func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.last.Store(int64(time.Since(c.sh.epoch)))
		if c.idle.Load() {
			c.idle.Store(false)
		}
	}
	return n, err
}

// Close stops counting c and closes it.
func (c *trackedConn) Close() error {
	c.sh.forget(c)
	return c.Conn.Close()
}

// CloseWrite half-closes a TCP connection, as net/http does before it
// closes one after an error, so that the client reads the answer rather
// than a reset.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// ReadFrom keeps the connection's own ReadFrom (TCP's sendfile and splice).
func (c *trackedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// track counts a new connection as waiting and sheds past the bound.
func (sh *Shedder) track(nc net.Conn) *trackedConn {
	c := &trackedConn{Conn: nc, sh: sh, idx: -1}
	c.last.Store(int64(time.Since(sh.epoch)))
	sh.mu.Lock()
	sh.seq++
	c.seq = sh.seq
	sh.addLocked(c)
	victims := sh.overLocked()
	sh.mu.Unlock()
	sh.close(victims, shedCap)
	return c
}

// busy stops counting c as waiting: its request is in, and in flight.
func (sh *Shedder) busy(c *trackedConn) {
	sh.mu.Lock()
	sh.removeLocked(c)
	sh.mu.Unlock()
}

// idleNow counts c as waiting again, idle from now: its answer is done.
func (sh *Shedder) idleNow(c *trackedConn) {
	c.last.Store(int64(time.Since(sh.epoch)))
	c.idle.Store(true)
	sh.mu.Lock()
	if c.closed || c.idx >= 0 {
		sh.mu.Unlock()
		return
	}
	sh.addLocked(c)
	victims := sh.overLocked()
	sh.mu.Unlock()
	sh.close(victims, shedCap)
}

// forget stops counting c for good.
func (sh *Shedder) forget(c *trackedConn) {
	sh.mu.Lock()
	sh.removeLocked(c)
	c.closed = true
	sh.mu.Unlock()
}

// outOfDescriptors sheds the longest silent waiting connection after an
// accept failed with err for want of a descriptor, and warns at most once
// a minute.
func (sh *Shedder) outOfDescriptors(err error) {
	sh.mu.Lock()
	var victims []*trackedConn
	if v := sh.silentLocked(); v != nil {
		sh.removeLocked(v)
		v.closed = true
		victims = append(victims, v)
	}
	warn := sh.lastWarn.IsZero() || time.Since(sh.lastWarn) >= time.Minute
	if warn {
		sh.lastWarn = time.Now()
	}
	waiting := len(sh.waiting)
	sh.mu.Unlock()
	sh.close(victims, shedDescriptors)
	if warn {
		sh.logger.Warn("out of file descriptors: raise the process's limit (ulimit -n) or lower proxy.max_reading_connections",
			"err", err, "max_reading_connections", sh.max, "waiting", waiting)
	}
}

// addLocked counts c as waiting. The caller must hold mu.
func (sh *Shedder) addLocked(c *trackedConn) {
	c.idx = len(sh.waiting)
	sh.waiting = append(sh.waiting, c)
}

// removeLocked stops counting c as waiting, if it was. The caller must
// hold mu.
func (sh *Shedder) removeLocked(c *trackedConn) {
	i := c.idx
	if i < 0 {
		return
	}
	n := len(sh.waiting) - 1
	sh.waiting[i] = sh.waiting[n]
	sh.waiting[i].idx = i
	sh.waiting[n] = nil
	sh.waiting = sh.waiting[:n]
	c.idx = -1
}

// overLocked takes waiting connections past the bound out of the count,
// longest silent first, marks them closed and returns them to be closed.
// The caller must hold mu.
func (sh *Shedder) overLocked() []*trackedConn {
	var victims []*trackedConn
	for len(sh.waiting) > sh.max {
		v := sh.silentLocked()
		sh.removeLocked(v)
		v.closed = true
		victims = append(victims, v)
	}
	return victims
}

// silentLocked returns the waiting connection silent the longest, the
// oldest among equals, or nil if none waits. A scan: it runs only when
// shedding, and the set is bounded. The caller must hold mu.
func (sh *Shedder) silentLocked() *trackedConn {
	var v *trackedConn
	var vLast int64
	for _, c := range sh.waiting {
		if last := c.last.Load(); v == nil || last < vLast || last == vLast && c.seq < v.seq {
			v, vLast = c, last
		}
	}
	return v
}

// close closes the connections shed for reason and counts them. They are
// closed beneath any TLS: a client that sends nothing is owed no
// close_notify, and writing one could block on a full socket.
func (sh *Shedder) close(victims []*trackedConn, reason int) {
	for _, v := range victims {
		state := stateReading
		if v.idle.Load() {
			state = stateIdle
		}
		sh.shed[reason][state].Inc()
		v.Conn.Close()
	}
}

// trackedKey is the context key of a request's *trackedConn.
type trackedKey struct{}

// connContext carries a counted connection in its requests' context, for
// [Server.limits] to say when a request's body is all in.
func connContext(ctx context.Context, nc net.Conn) context.Context {
	if c := trackedOf(nc); c != nil {
		return context.WithValue(ctx, trackedKey{}, c)
	}
	return ctx
}

// connState counts a connection as waiting again once its answer is done.
func connState(nc net.Conn, st http.ConnState) {
	if st == http.StateIdle {
		if c := trackedOf(nc); c != nil {
			c.sh.idleNow(c)
		}
	}
}

// trackedOf returns the counted connection under nc, or nil if a
// [Shedder] does not count it.
func trackedOf(nc net.Conn) *trackedConn {
	switch c := nc.(type) {
	case *trackedConn:
		return c
	case *tls.Conn:
		tc, _ := c.NetConn().(*trackedConn)
		return tc
	}
	return nil
}

// watchRequest stops counting r's connection as waiting once r is all in:
// at once when it has no body, else when its body has been read to the
// end by the handler. A body left unread keeps it counted, since net/http
// goes on to read it after the handler.
func watchRequest(r *http.Request) {
	c, _ := r.Context().Value(trackedKey{}).(*trackedConn)
	switch {
	case c == nil:
	case r.ContentLength == 0:
		c.sh.busy(c)
	default:
		r.Body = &watchedBody{ReadCloser: r.Body, c: c, left: r.ContentLength}
	}
}

// watchedBody is a request body that reports its end to its connection's
// [Shedder].
type watchedBody struct {
	io.ReadCloser
	c    *trackedConn // nil once reported
	left int64        // bytes to come if the length is known; negative if chunked
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.c != nil {
		b.left -= int64(n)
		if err == io.EOF || b.left == 0 {
			b.c.sh.busy(b.c)
			b.c = nil
		}
	}
	return n, err
}
