package capture

import (
	"bufio"
	"cmp"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/prefix"
)

// BlockTokens is the most prompt tokens a hash id stands for
// ([Config.BlockTokens]), the Mooncake traces' block, and the one a line
// that does not say its block_tokens has; a block is that many tokens ×
// [prefix.BytesPerToken] bytes of canonical prompt, the last one partial.
const BlockTokens = 512

// DefaultBlockTokens is [Config.BlockTokens]'s default.
const DefaultBlockTokens = 128

// maxBlockBytes is the largest block in canonical prompt bytes.
const maxBlockBytes = BlockTokens * prefix.BytesPerToken

// MaxIDs bounds the hash ids of one line: 2M tokens of prompt, more than
// proxy.max_body_bytes lets through by default.
const MaxIDs = 4096

// idMask keeps ids within 53 bits, so that every JSON reader (JavaScript,
// jq) reads them exactly.
const idMask = 1<<53 - 1

// Line is one captured request. The proxy fills it in; the writer turns
// it into a JSON line.
type Line struct {
	// Arrived is when the request arrived; its line's timestamp counts
	// from the capture's start.
	Arrived time.Time
	// InputLength is the prompt's tokens: as the server reported them,
	// else llmlb's estimate. OutputLength is the completion's tokens as
	// the server reported them, 0 if it reported none.
	InputLength, OutputLength int
	// HashIDs are the prompt's block ids ([Writer.Hash]).
	HashIDs []uint64
	// Model is the model the client asked for; Target the one the
	// backends were asked for, "" when the same.
	Model, Target string
	// API is completions, chat, responses or messages.
	API string
	// Stream reports whether the client asked for a stream.
	Stream bool
	// Priority is the request's priority; negative is sheddable.
	Priority int
	// MaxTokens is the output tokens asked for, 0 if not said.
	MaxTokens int
	// Session and Conversation are keyed hashes of the session header's
	// value and of the chat's prompt through its first user message (the
	// same on every turn); 0 for none.
	Session, Conversation uint64
	// Usage reports whether the server reported usage: then
	// PromptTokens is its prompt tokens, and CachedTokens its cached ones
	// when CachedKnown.
	Usage, CachedKnown         bool
	PromptTokens, CachedTokens int
	// Backend is the ID of the backend that answered, "" if none did.
	Backend string
	// Status is the status the client got (499: it left).
	Status int
	// TTFT is a stream's time to its first token from sending it to the
	// backend, 0 if not seen; Duration the request's whole time.
	TTFT, Duration time.Duration
}

// Metrics are the counters every capture of a process adds to, so that
// they outlive a capture a reload replaces.
type Metrics struct {
	lines   prometheus.Counter
	full    prometheus.Counter
	errored prometheus.Counter
}

// NewMetrics registers the capture metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	lines := prometheus.NewCounter(prometheus.CounterOpts{Name: "llmlb_capture_lines_total", Help: "Requests written to the capture file."})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmlb_capture_dropped_total",
		Help: "Sampled requests not written to the capture file: reason full (the buffer was full, or the capture was closing) or error (the write failed)."}, []string{"reason"})
	if reg != nil {
		reg.MustRegister(lines, dropped)
	}
	return &Metrics{lines: lines, full: dropped.WithLabelValues("full"), errored: dropped.WithLabelValues("error")}
}

// Options tune a [Writer] beyond its [Config].
type Options struct {
	// Metrics counts lines written and dropped; nil counts nowhere.
	Metrics *Metrics
	// Logger logs write errors, once per failing stretch; nil discards.
	Logger *slog.Logger
	// Start is when the capture starts, the origin of its timestamps;
	// zero is now.
	Start time.Time
	// Rand draws the sampling decision, uniform in [0,1); nil is
	// math/rand/v2.
	Rand func() float64
	// Buffer is how many lines may wait for the file before new ones are
	// dropped. (default 4096)
	Buffer int
}

// Writer is one capture: a file written by its own goroutine from a
// bounded buffer. Add, Sampled, SetSample, Hash and Key may be called
// concurrently, by any number of requests, and never block on the file.
// Close flushes and stops it.
type Writer struct {
	// immutable after Open
	path     string
	maxBytes int64
	maxFiles int
	prf      cipher.Block // the salt's key: ids are AES-128 of the hashes
	block    int          // tokens an id stands for ([Config.BlockTokens])
	start    time.Time
	rand     func() float64
	limit    int
	m        *Metrics
	logger   *slog.Logger
	wake     chan struct{} // cap 1: lines are waiting
	done     chan struct{} // closed when the goroutine has closed the file

	sample atomic.Uint64 // math.Float64bits of the ratio

	mu     sync.Mutex
	buf    []Line // guarded by mu; lines waiting for the file
	spare  []Line // guarded by mu; the batch last written, for reuse
	closed bool   // guarded by mu
	once   sync.Once
	err    error // set by the goroutine before done closes: the file's close error

	// the goroutine's own
	f      *os.File
	bw     *bufio.Writer
	size   int64
	enc    []byte
	failed bool // the last write failed: logged once
}

// Open starts a capture of cfg to cfg.Path, keyed by salt (nil: a random
// one). A file already at the path is rotated away first, so that each
// capture's time origin and salt start a file of their own.
func Open(cfg Config, salt []byte, o Options) (*Writer, error) {
	if !cfg.Enabled() {
		return nil, errors.New("capture.path: empty")
	}
	if len(salt) == 0 {
		salt = make([]byte, 32)
		_, _ = rand.Read(salt)
	}
	key := sha256.Sum256(salt)
	prf, err := aes.NewCipher(key[:16])
	if err != nil {
		return nil, err
	}
	if o.Start.IsZero() {
		o.Start = time.Now()
	}
	if o.Rand == nil {
		o.Rand = mrand.Float64
	}
	if o.Buffer <= 0 {
		o.Buffer = 4096
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Writer{path: cfg.Path, maxBytes: cfg.MaxBytes, maxFiles: cfg.MaxFiles, prf: prf, block: cmp.Or(cfg.BlockTokens, DefaultBlockTokens), start: o.Start, rand: o.Rand,
		limit: o.Buffer, m: o.Metrics, logger: o.Logger, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.SetSample(cfg.Sample)
	if st, err := os.Stat(w.path); err == nil && st.Size() > 0 {
		if err := w.shift(); err != nil {
			return nil, fmt.Errorf("capture.path: %w", err)
		}
	}
	if err := w.create(); err != nil {
		return nil, fmt.Errorf("capture.path: %w", err)
	}
	go w.run()
	return w, nil
}

// SetSample sets the share of requests captured, 0 to 1.
func (w *Writer) SetSample(ratio float64) { w.sample.Store(math.Float64bits(ratio)) }

// Sampled draws whether to capture one request.
func (w *Writer) Sampled() bool {
	r := math.Float64frombits(w.sample.Load())
	switch {
	case r >= 1:
		return true
	case r <= 0:
		return false
	}
	return w.rand() < r
}

// id is h under the capture's key: the first 8 bytes of AES-128 of h,
// cut to 53 bits. A keyed pseudo-random function, so that knowing a text
// and the hashing code does not tell its id without the salt (a hash of
// salt and h by xxhash, which is not keyed by design, might); equal
// hashes still give equal ids.
func (w *Writer) id(h uint64) uint64 {
	var b [aes.BlockSize]byte
	binary.LittleEndian.PutUint64(b[:8], h)
	w.prf.Encrypt(b[:], b[:])
	return binary.LittleEndian.Uint64(b[:8]) & idMask
}

// Key returns a keyed hash of s (a session header's value); 0 for "".
func (w *Writer) Key(s string) uint64 {
	if s == "" {
		return 0
	}
	return w.id(xxhash.Sum64String(s))
}

// Hash sets l's HashIDs and Conversation from the canonical prompt p,
// whose chain is seeded with seed ([prefix.Seed]: the target model and
// cache_salt, so that requests which never share a server's cache never
// share an id). One id per block of the capture's tokens, the last one
// partial, as the Mooncake traces have them, at most [MaxIDs]. The conversation key
// is the hash of the prompt through its first user message, 0 for a
// prompt without one.
func (w *Writer) Hash(l *Line, p *prefix.Parts, seed uint64) {
	blockBytes := w.block * prefix.BytesPerToken
	n := min(MaxIDs, (p.Len()+blockBytes-1)/blockBytes)
	hs := p.AppendHashes(slices.Grow(l.HashIDs[:0], n), seed, blockBytes, MaxIDs, true)
	if t := p.FirstTurn; t > 0 && t <= p.Len() {
		j := t / blockBytes // full blocks before the first turn's end
		if j <= len(hs) {
			chain := seed
			if j > 0 {
				chain = hs[j-1]
			}
			var tail [maxBlockBytes]byte
			rest := p.AppendRange(tail[:0], j*blockBytes, t)
			d := xxhash.NewWithSeed(chain)
			_, _ = d.Write(rest)
			l.Conversation = w.id(d.Sum64())
		}
	}
	// One buffer for all the blocks the cipher reads (a slice passed to
	// it escapes: one allocation a request, not one an id).
	buf := make([]byte, aes.BlockSize*len(hs))
	for i, h := range hs {
		b := buf[i*aes.BlockSize : (i+1)*aes.BlockSize]
		binary.LittleEndian.PutUint64(b, h)
		w.prf.Encrypt(b, b)
		hs[i] = binary.LittleEndian.Uint64(b) & idMask
	}
	l.HashIDs = hs
}

// Add queues l for the file and returns at once: a full buffer, or a
// capture closing, drops it and counts it. l's HashIDs are the writer's
// from then on.
func (w *Writer) Add(l Line) {
	w.mu.Lock()
	if w.closed || len(w.buf) >= w.limit {
		w.mu.Unlock()
		if w.m != nil {
			w.m.full.Inc()
		}
		return
	}
	w.buf = append(w.buf, l)
	half := len(w.buf) >= w.limit/2
	w.mu.Unlock()
	if half { // else the next tick writes it: one wake-up and one write for many lines
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// flushEvery is how often the goroutine writes what is queued when the
// buffer is less than half full. A wake-up and a write(2) per request cost
// 5% of the requests per second at 64 clients (issue 57's bound); a line
// on disk a quarter second later costs nothing.
const flushEvery = 250 * time.Millisecond

// Close stops the capture once the lines queued before it are written,
// and closes the file. Lines added after it are dropped. It may be called
// more than once.
func (w *Writer) Close() error {
	w.once.Do(func() {
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	})
	<-w.done
	return w.err
}

// Path is the file the capture writes.
func (w *Writer) Path() string { return w.path }

// run writes what Add queues until Close.
func (w *Writer) run() {
	defer close(w.done)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case <-w.wake:
		case <-tick.C:
		}
		w.mu.Lock()
		batch, closed := w.buf, w.closed
		w.buf, w.spare = w.spare, nil
		w.mu.Unlock()
		w.write(batch)
		clear(batch) // the lines' ids are not kept
		w.mu.Lock()
		w.spare = batch[:0]
		w.mu.Unlock()
		if closed {
			w.err = w.f.Close()
			return
		}
	}
}

// write appends batch to the file, rotating it as it fills.
func (w *Writer) write(batch []Line) {
	if len(batch) == 0 {
		return
	}
	var err error
	written := 0
	for i := range batch {
		w.enc = w.appendLine(w.enc[:0], &batch[i])
		if w.size > 0 && w.size+int64(len(w.enc)) > w.maxBytes {
			if err = w.rotate(); err != nil {
				break
			}
		}
		if _, err = w.bw.Write(w.enc); err != nil {
			break
		}
		w.size += int64(len(w.enc))
		written++
	}
	if err == nil {
		err = w.bw.Flush()
	}
	if err != nil {
		if w.m != nil {
			w.m.errored.Add(float64(len(batch) - written))
		}
		if !w.failed {
			w.logger.Error("capture write failed; lines are dropped until it works", "file", w.path, "err", err)
		}
		w.failed = true
		if w.f != nil {
			w.bw.Reset(w.f) // bufio keeps its first error: start clean
		}
		return
	}
	if w.failed {
		w.logger.Info("capture writes again", "file", w.path)
		w.failed = false
	}
	if w.m != nil {
		w.m.lines.Add(float64(written))
	}
}

// create opens a new, empty file at the path, readable by its owner only.
func (w *Writer) create() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	w.f, w.size = f, 0
	if w.bw == nil {
		w.bw = bufio.NewWriterSize(f, 64<<10)
	} else {
		w.bw.Reset(f)
	}
	return nil
}

// rotate closes the full file, shifts it to Path.1 (and each older one
// up, the oldest beyond MaxFiles removed) and starts a new one.
func (w *Writer) rotate() error {
	if err := w.bw.Flush(); err != nil {
		return err
	}
	if err := w.f.Close(); err != nil {
		return err
	}
	w.f = nil
	if err := w.shift(); err != nil {
		return err
	}
	return w.create()
}

// shift moves the file at the path to Path.1, Path.1 to Path.2 and so on,
// removing what would pass Path.MaxFiles.
func (w *Writer) shift() error {
	name := func(i int) string {
		if i == 0 {
			return w.path
		}
		return w.path + "." + strconv.Itoa(i)
	}
	if err := os.Remove(name(w.maxFiles)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for i := w.maxFiles - 1; i >= 0; i-- {
		if err := os.Rename(name(i), name(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}
