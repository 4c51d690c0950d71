package proxy

import (
	"errors"
	"io"
	"strings"
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

// TestHeldBodyWaitsForEveryReader: the buffer goes back only when the
// handler and every attempt's reader have let go, and a closed reader
// reads nothing more.
func TestHeldBodyWaitsForEveryReader(t *testing.T) {
	var p sizedPool
	text := `{"model":"m","prompt":"` + strings.Repeat("a", inlineBody) + `"}`
	buf := p.get(len(text))
	*buf = append(*buf, text...)
	h := newHeldBody(&p, buf)
	body := sendBody{head: *buf, tail: []byte(`,"x":1}`), held: h}
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
