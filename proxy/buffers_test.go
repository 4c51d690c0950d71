package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestSizedPoolCapacity: get lends at least the capacity asked for, from
// 1 byte to past the largest class, and put takes back grown buffers.
func TestSizedPoolCapacity(t *testing.T) {
	var p sizedPool
	for _, n := range []int{0, 1, 4095, 4096, 4097, 220 << 10, 1<<25 + 1} {
		b := p.get(n)
		if len(*b) != 0 || cap(*b) < n {
			t.Errorf("get(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		*b = append(*b, make([]byte, cap(*b)+1)...)
		p.put(b)
	}
}

// TestSizedPoolReadAll reads bodies of every size, with and without a
// known length, whole.
func TestSizedPoolReadAll(t *testing.T) {
	var p sizedPool
	for _, n := range []int{0, 10, 4096, 100 << 10} {
		want := strings.Repeat("x", n)
		for _, hint := range []int64{-1, 0, int64(n)} {
			b, err := p.readAll(io.LimitReader(strings.NewReader(want), int64(n)), hint)
			if err != nil || string(*b) != want {
				t.Errorf("readAll(%d bytes, hint %d) = %d bytes, %v", n, hint, len(*b), err)
			}
			p.put(b)
		}
	}
}

// heldSend puts text in a buffer from p, held by the handler, and returns
// the hold and a body that sends the buffer followed by a rewritten tail,
// `,"x":1}`.
func heldSend(p *sizedPool, text string) (*heldBody, sendBody) {
	buf := p.get(len(text))
	*buf = append(*buf, text...)
	h := newHeldBody(p, buf)
	return h, sendBody{head: *buf, tail: []byte(`,"x":1}`), held: h}
}

// TestHeldBodyWaitsForEveryReader: the buffer goes back only when the
// handler and every attempt's reader have let go, and a closed reader
// reads nothing more.
func TestHeldBodyWaitsForEveryReader(t *testing.T) {
	var p sizedPool
	text := `{"model":"m","prompt":"` + strings.Repeat("a", inlineBody) + `"}`
	h, body := heldSend(&p, text)
	r1, r2 := body.open(), body.open()
	h.release() // the handler is done
	got, err := io.ReadAll(r1)
	if err != nil || string(got) != text+`,"x":1}` {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	r1.Close()
	r1.Close() // a second close lets go of nothing more
	if n := h.refs.Load(); n != 1 {
		t.Fatalf("%d holds left with one reader open, want 1", n)
	}
	r2.Close()
	if n := h.refs.Load(); n != 0 {
		t.Fatalf("%d holds left, want 0", n)
	}
	if _, err := r2.Read(make([]byte, 4)); !errors.Is(err, errBodyClosed) {
		t.Errorf("Read after Close: %v, want errBodyClosed", err)
	}
}

// TestSmallBodyIsSentFromACopy: a body that fits the transport's write
// buffer is read from a copy of its own, which holds no pooled buffer and
// stays whole after the buffer is lent again.
func TestSmallBodyIsSentFromACopy(t *testing.T) {
	var p sizedPool
	buf := p.get(16)
	*buf = append(*buf, `{"model":"m"}`...)
	h := newHeldBody(&p, buf)
	body := sendBody{head: (*buf)[:len(*buf)-1], tail: []byte(`,"x":1}`), held: h}
	r := body.open()
	if n := h.refs.Load(); n != 1 {
		t.Fatalf("%d holds with a small body's reader open, want 1 (the handler's)", n)
	}
	h.release()
	copy(*buf, "XXXXXXXXXXXXX") // the pool lends the buffer again
	got, err := io.ReadAll(r)
	if err != nil || string(got) != `{"model":"m","x":1}` {
		t.Fatalf("read %q, %v", got, err)
	}
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestHeldBodyWriteTo: io.Copy sends a held body in two writes (head and
// tail), not in 32 KB pieces, and a Close that comes while a write is
// under way (the transport closes bodies from another goroutine) neither
// waits for it nor lets the buffer go before the write has returned.
func TestHeldBodyWriteTo(t *testing.T) {
	var p sizedPool
	text := `{"model":"m","prompt":"` + strings.Repeat("a", 200<<10) + `"}`
	h, body := heldSend(&p, text)
	h.hold() // the test's own hold, so that refs count the reader's alone
	defer h.release()

	var writes []int
	var got []byte
	r := body.open()
	if _, err := io.Copy(writerFunc(func(b []byte) (int, error) {
		writes = append(writes, len(b))
		got = append(got, b...)
		return len(b), nil
	}), r); err != nil {
		t.Fatal(err)
	}
	if len(writes) != 2 || string(got) != text+`,"x":1}` {
		t.Errorf("io.Copy wrote %v (%d bytes), want the head and the tail in two writes", writes, len(got))
	}
	r.Close()

	h.release() // the handler is done: only the test's and the reader's holds are left
	r = body.open()
	entered, unblock, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(writerFunc(func(b []byte) (int, error) {
			if len(b) > 100 {
				close(entered)
				<-unblock
			}
			return len(b), nil
		}), r)
	}()
	<-entered
	r.Close() // returns at once: the write is still under way
	if n := h.refs.Load(); n != 2 {
		t.Errorf("%d holds during the write after Close, want 2 (the test's and the writer's)", n)
	}
	close(unblock)
	<-done
	if n := h.refs.Load(); n != 1 {
		t.Errorf("%d holds after the write ended, want 1 (the test's)", n)
	}
	if _, err := r.Read(make([]byte, 4)); !errors.Is(err, errBodyClosed) {
		t.Errorf("Read after Close: %v, want errBodyClosed", err)
	}
}

// countingConn counts the Write calls made on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int32
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestLongBodyGoesToTheBackendInOneWrite: through net/http's own
// transport, a held 220 KB body reaches the connection in one write after
// the headers (without bodyConn, io.Copy's 32 KB pieces made 8).
func TestLongBodyGoesToTheBackendInOneWrite(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	}))
	defer backend.Close()
	var writes atomic.Int32
	var d net.Dialer
	tr := &http.Transport{DialContext: dialBodyConn(func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		return countingConn{c, &writes}, err
	})}
	defer tr.CloseIdleConnections()

	var p sizedPool
	buf := p.get(220 << 10)
	*buf = append(*buf, strings.Repeat("a", 220<<10)...)
	body := sendBody{head: *buf, held: newHeldBody(&p, buf)}
	for range 2 { // a new connection, then a reused one
		writes.Store(0)
		req, _ := http.NewRequest(http.MethodPost, backend.URL, nil)
		req.Body, req.ContentLength = body.open(), body.size()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != fmt.Sprint(220<<10) {
			t.Fatalf("backend read %s bytes", got)
		}
		if n := writes.Load(); n > 2 {
			t.Errorf("%d writes for the headers and a 220 KB body, want 2", n)
		}
	}
}
