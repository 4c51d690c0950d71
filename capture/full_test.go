//go:build unix

package capture

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFullBufferDropsWithoutBlocking: with the file stuck (a pipe nobody
// reads), Add still returns at once; what the buffer cannot hold is
// dropped and counted, and Close writes the rest once the file moves.
func TestFullBufferDropsWithoutBlocking(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Path = filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(cfg.Path, 0o600); err != nil {
		t.Skip("no fifo:", err)
	}
	r, err := os.OpenFile(cfg.Path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const limit, n = 8, 200
	w := open(t, cfg, testSalt, Options{Buffer: limit})
	huge := make([]uint64, MaxIDs) // a line longer than a pipe holds: the writer blocks on it
	for i := range huge {
		huge[i] = 1 << 52
	}
	w.Add(Line{InputLength: 1, HashIDs: huge})
	for range n {
		w.Add(Line{InputLength: 1, HashIDs: []uint64{1}}) // returns: the test would hang otherwise
	}
	// At most one batch taken by the blocked writer and one buffer
	// waiting: everything beyond is dropped.
	if got := testutil.ToFloat64(w.m.full); got < n+1-2*limit {
		t.Errorf("dropped %v of %d, want at least %d", got, n+1, n+1-2*limit)
	}
	if err := syscall.SetNonblock(int(r.Fd()), false); err != nil {
		t.Fatal(err)
	}
	read := make(chan int64)
	go func() { k, _ := io.Copy(io.Discard, r); read <- k }()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	<-read // the writer closed its end
	if lines, dropped := testutil.ToFloat64(w.m.lines), testutil.ToFloat64(w.m.full); lines+dropped != n+1 {
		t.Errorf("written %v + dropped %v, want %d", lines, dropped, n+1)
	}
}
