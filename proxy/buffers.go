package proxy

import (
	"bytes"
	"errors"
	"io"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Request bodies and canonical prompts are read into buffers lent by a
// sizedPool and given back when the request is finished, so that a long
// prompt (hundreds of KB) costs no fresh allocation, no zeroing and no
// garbage on each request (issue 19: on 220 KB chats, allocation and GC
// were about a fifth of llmlb's CPU).

// Buffer classes: powers of two from 4 KB to 32 MB; larger buffers are
// left to the garbage collector.
const (
	minClassBits = 12
	maxClassBits = 25
)

// sizedPool lends byte buffers by size class. Its methods may be called
// concurrently.
type sizedPool struct {
	classes [maxClassBits - minClassBits + 1]sync.Pool // of *[]byte
}

// get returns a buffer of length 0 and capacity at least n.
func (p *sizedPool) get(n int) *[]byte {
	c := max(minClassBits, bits.Len(uint(max(n, 1)-1)))
	if c > maxClassBits {
		b := make([]byte, 0, n)
		return &b
	}
	if b, ok := p.classes[c-minClassBits].Get().(*[]byte); ok {
		*b = (*b)[:0]
		return b
	}
	b := make([]byte, 0, 1<<c)
	return &b
}

// put gives b back; b must not be used after. A buffer grown past its
// class goes to the class its capacity fills.
func (p *sizedPool) put(b *[]byte) {
	c := bits.Len(uint(cap(*b))) - 1
	if c < minClassBits || c > maxClassBits {
		return
	}
	p.classes[c-minClassBits].Put(b)
}

// readAll reads r into a buffer from p, sized for n bytes when n > 0.
func (p *sizedPool) readAll(r io.Reader, n int64) (*[]byte, error) {
	b := p.get(int(max(n, 0)) + bytes.MinRead)
	for {
		if len(*b) == cap(*b) {
			*b = append(*b, 0)[:len(*b)] // grows, keeping the pointer p lent
		}
		m, err := r.Read((*b)[len(*b):cap(*b)])
		*b = (*b)[:len(*b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// heldBody is a request body in a pooled buffer, held by the handler and
// by every reader an attempt sends from; the buffer goes back to the pool
// when the last of them lets go, so that no transport still writing an
// earlier attempt can see it reused.
type heldBody struct {
	pool *sizedPool
	buf  *[]byte
	refs atomic.Int32
}

func newHeldBody(pool *sizedPool, buf *[]byte) *heldBody {
	h := &heldBody{pool: pool, buf: buf}
	h.refs.Store(1)
	return h
}

// hold adds a hold. A nil heldBody is a body not pooled.
func (h *heldBody) hold() {
	if h != nil {
		h.refs.Add(1)
	}
}

// release lets go of one hold. A nil heldBody is a body not pooled.
func (h *heldBody) release() {
	if h != nil && h.refs.Add(-1) == 0 {
		h.pool.put(h.buf)
	}
}

var errBodyClosed = errors.New("request body read after close")

// heldReader reads an attempt's body, head then tail, from a held buffer.
// After Close it reads nothing more: net/http's transport may close a
// request body from another goroutine than the one reading it, and the
// buffer may be lent again once every reader let go. Close never waits
// for a write under way in WriteTo; the hold is let go when both have
// ended, so no write ever sends from a buffer lent again.
type heldReader struct {
	mu         sync.Mutex
	head, tail []byte // what is left to send
	held       *heldBody
	closed     bool
	writing    bool // WriteTo is sending from the buffer, outside mu
}

func (b *heldReader) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errBodyClosed
	}
	if len(b.head) == 0 && len(b.tail) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.head)
	b.head = b.head[n:]
	m := copy(p[n:], b.tail)
	b.tail = b.tail[m:]
	return n + m, nil
}

// size is what is left to send.
func (b *heldReader) size() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int64(len(b.head) + len(b.tail))
}

// WriteTo hands w the body in at most two writes, head and tail, so that
// a long prompt goes to the connection in one write call instead of
// through io.Copy's 32 KB buffer (net/http's transport copies a request
// body with io.Copy, which prefers a WriterTo).
func (b *heldReader) WriteTo(w io.Writer) (int64, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0, errBodyClosed
	}
	head, tail := b.head, b.tail
	b.head, b.tail = nil, nil
	b.writing = true
	b.mu.Unlock()
	var n int64
	var err error
	for _, part := range [2][]byte{head, tail} {
		if len(part) == 0 || err != nil {
			continue
		}
		var m int
		m, err = w.Write(part)
		n += int64(m)
	}
	b.mu.Lock()
	b.writing = false
	if b.closed {
		b.held.release() // Close came during the write and left the hold to us
	}
	b.mu.Unlock()
	return n, err
}

func (b *heldReader) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		if !b.writing {
			b.held.release()
		}
	}
	return nil
}
