package sim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FaultKind names one way an emulated server misbehaves (issue 17).
type FaultKind string

// The faults a [Server] can be told to show. Connection faults hit every
// route except /sim/faults; generation faults hit the inference routes
// (completions, chat, Responses and Messages) and leave /health
// answering, as a broken engine behind a live HTTP front does; the metrics
// and health faults hit only their page.
const (
	// FaultRefuse closes the listening socket, so connections are refused,
	// and resets every open connection, as a killed process does. It needs
	// the server's listener wrapped by [Server.Listener].
	FaultRefuse FaultKind = "refuse"
	// FaultClose accepts each request and closes the connection without
	// an answer.
	FaultClose FaultKind = "close"
	// FaultDieMidStream ends an answer after Events tokens: a stream after
	// its first Events content chunks, with the events an API sends along
	// with them (chat's role chunk before the first, the Responses and
	// Messages APIs' opening events) and none after (no finish_reason or
	// usage, and no terminator: no [DONE], message_stop or
	// response.completed). Framing says how the body ends (issue 53):
	//
	//   - cut (the default): the connection is cut, so the chunked body
	//     ends without its last chunk, as a killed worker's does; a
	//     non-streamed request gets no answer at all.
	//   - clean: the handler returns, so the chunked body ends with its
	//     last chunk, whole to HTTP though its stream has no terminator. A
	//     non-streamed answer is the first half of its JSON's bytes, with
	//     a Content-Length of that half: a clean body of broken JSON.
	//   - close: the answer's headers have Connection: close and neither
	//     Transfer-Encoding nor Content-Length, so the body is delimited by
	//     the connection, which is closed after the Events tokens (a
	//     non-streamed answer: after the first half of its JSON's bytes).
	//     HTTP/2 has no such framing: there close cuts, as cut does.
	//
	// It takes the requests that begin while it shows, Share of them (see
	// [Fault.Share]), so "die-mid-stream:events=3" cuts every stream after
	// its third chunk and "die-mid-stream:events=3,framing=clean,share=0.2"
	// ends every fifth stream cleanly after its third. An answer of Events
	// tokens or fewer ends whole (under close, delimited by the
	// connection). A background response's generation stops after Events
	// tokens whatever the framing, and the response is stored failed.
	FaultDieMidStream FaultKind = "die-mid-stream"
	// FaultHang never sends response headers.
	FaultHang FaultKind = "hang"
	// FaultStall sends Events tokens, then nothing, keeping the
	// connection open.
	FaultStall FaultKind = "stall"
	// FaultDrip sends every token, the first included, Gap apart.
	FaultDrip FaultKind = "drip"
	// Fault5xx answers every generation with Status (500 by default).
	Fault5xx FaultKind = "5xx"
	// Fault429 answers every generation 429 with Retry-After, as an
	// overloaded server does.
	Fault429 FaultKind = "429"
	// FaultMetricsGarbage serves bytes that are not Prometheus text.
	FaultMetricsGarbage FaultKind = "metrics-garbage"
	// FaultMetricsHuge serves the page followed by Bytes of extra series.
	FaultMetricsHuge FaultKind = "metrics-huge"
	// FaultMetricsHang never answers the metrics page.
	FaultMetricsHang FaultKind = "metrics-hang"
	// FaultHealthFlap answers /health 503 and 200 in turn, Gap each.
	FaultHealthFlap FaultKind = "health-flap"
)

// FaultKinds lists every fault, in the order the fault drill in
// docs/operations.md gives them.
func FaultKinds() []FaultKind {
	return []FaultKind{FaultRefuse, FaultClose, FaultDieMidStream, FaultHang, FaultStall, FaultDrip,
		Fault5xx, Fault429, FaultMetricsGarbage, FaultMetricsHuge, FaultMetricsHang, FaultHealthFlap}
}

// Framing is how the die-mid-stream fault ends the body of an answer it
// takes; see [FaultDieMidStream].
type Framing string

// The framings of die-mid-stream.
const (
	// FramingCut cuts the connection: a chunked body without its last
	// chunk.
	FramingCut Framing = "cut"
	// FramingClean ends the chunked body with its last chunk, or a
	// non-streamed answer's with its Content-Length, before the answer
	// is whole.
	FramingClean Framing = "clean"
	// FramingClose sends a body delimited by the connection, and closes
	// the connection before the answer is whole.
	FramingClose Framing = "close"
)

// Framings lists die-mid-stream's framings, the default first.
func Framings() []Framing { return []Framing{FramingCut, FramingClean, FramingClose} }

// Fault is one fault and when it shows.
type Fault struct {
	Kind FaultKind
	// After delays the fault from the moment it was set. (default 0)
	After time.Duration
	// For is how long the fault lasts; 0 means until the faults are
	// replaced.
	For time.Duration
	// Events is how many tokens, a stream's content chunks, die-mid-stream
	// and stall let through first. (default 2)
	Events int
	// Gap is drip's time between tokens (default 3s) and health-flap's
	// time in each state (default 1s).
	Gap time.Duration
	// Status is 5xx's answer, 500 to 599. (default 500)
	Status int
	// Bytes is what metrics-huge adds to the page. (default 48 MiB, over
	// the 32 MiB llmlb reads of a page)
	Bytes int64
	// Framing is how die-mid-stream ends a body; "" is FramingCut.
	// (default cut)
	Framing Framing
	// Share is the fraction of requests die-mid-stream takes, above 0 and
	// at most 1; 0 is 1. The server numbers the generations it admits
	// from 1, and takes the n-th when ceil(n*Share) > ceil((n-1)*Share):
	// spread evenly, the first taken, the same on every run, so
	// share=0.25 takes the 1st, 5th, 9th and so on. (default 1)
	Share float64
}

// framing is f's Framing, FramingCut when unset.
func (f Fault) framing() Framing {
	if f.Framing == "" {
		return FramingCut
	}
	return f.Framing
}

// takes reports whether die-mid-stream takes the server's n-th
// generation, counted from 1; see [Fault.Share].
func (f Fault) takes(n int64) bool {
	if f.Share <= 0 || f.Share >= 1 {
		return true
	}
	return math.Ceil(float64(n)*f.Share) > math.Ceil(float64(n-1)*f.Share)
}

// String writes f as [ParseFaults] reads it.
func (f Fault) String() string {
	var params []string
	if f.After > 0 {
		params = append(params, "after="+f.After.String())
	}
	if f.For > 0 {
		params = append(params, "for="+f.For.String())
	}
	switch f.Kind {
	case FaultDieMidStream:
		params = append(params, "events="+strconv.Itoa(f.Events))
		if f.framing() != FramingCut {
			params = append(params, "framing="+string(f.Framing))
		}
		if f.Share > 0 && f.Share < 1 {
			params = append(params, "share="+strconv.FormatFloat(f.Share, 'g', -1, 64))
		}
	case FaultStall:
		params = append(params, "events="+strconv.Itoa(f.Events))
	case FaultDrip, FaultHealthFlap:
		params = append(params, "gap="+f.Gap.String())
	case Fault5xx:
		params = append(params, "status="+strconv.Itoa(f.Status))
	case FaultMetricsHuge:
		params = append(params, "bytes="+strconv.FormatInt(f.Bytes, 10))
	}
	if len(params) == 0 {
		return string(f.Kind)
	}
	return string(f.Kind) + ":" + strings.Join(params, ",")
}

// Faults is a set of faults; each shows on its own schedule.
type Faults []Fault

// String writes fs as [ParseFaults] reads it.
func (fs Faults) String() string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = f.String()
	}
	return strings.Join(s, ",")
}

// ParseFaults reads a fault list: kinds separated by commas, each with
// optional parameters after a colon, also separated by commas, for
// example "die-mid-stream:after=5s,for=10s,events=3,metrics-garbage". A
// word with "=" belongs to the kind before it. Parameters: after and for
// (durations, every kind), events (die-mid-stream, stall), framing (cut,
// clean or close) and share (a fraction above 0 and at most 1), both
// die-mid-stream's, gap (drip, health-flap), status (5xx), bytes
// (metrics-huge). [Fault.String] leaves out a framing of cut and a share
// of 1, the defaults. An empty string is no fault.
func ParseFaults(s string) (Faults, error) {
	var fs Faults
	var errs []error
	for w := range strings.SplitSeq(s, ",") {
		w = strings.TrimSpace(w)
		if w == "" {
			continue
		}
		kind, param, hasParam := strings.Cut(w, ":")
		if !hasParam && strings.Contains(w, "=") {
			if len(fs) == 0 {
				errs = append(errs, fmt.Errorf("fault parameter %q before any fault", w))
				continue
			}
			param, hasParam = w, true
		} else {
			k := FaultKind(kind)
			if !slices.Contains(FaultKinds(), k) {
				errs = append(errs, fmt.Errorf("unknown fault %q (known: %s)", kind, Faults(nil).kinds()))
				continue
			}
			fs = append(fs, defaultFault(k))
		}
		if hasParam {
			if err := fs[len(fs)-1].set(param); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return fs, nil
}

func (Faults) kinds() string {
	var s []string
	for _, k := range FaultKinds() {
		s = append(s, string(k))
	}
	return strings.Join(s, ", ")
}

func defaultFault(k FaultKind) Fault {
	f := Fault{Kind: k, Events: 2, Status: http.StatusInternalServerError, Bytes: 48 << 20, Framing: FramingCut, Share: 1}
	f.Gap = time.Second
	if k == FaultDrip {
		f.Gap = 3 * time.Second
	}
	return f
}

// set reads one name=value parameter into f.
func (f *Fault) set(param string) error {
	name, value, ok := strings.Cut(param, "=")
	if !ok {
		return fmt.Errorf("fault %s: parameter %q is not name=value", f.Kind, param)
	}
	dur := func(dst *time.Duration) error {
		d, err := time.ParseDuration(value)
		if err != nil || d < 0 {
			return fmt.Errorf("fault %s: %s=%q is not a duration of at least 0", f.Kind, name, value)
		}
		*dst = d
		return nil
	}
	only := func(kinds ...FaultKind) error {
		if !slices.Contains(kinds, f.Kind) {
			return fmt.Errorf("fault %s takes no %s", f.Kind, name)
		}
		return nil
	}
	switch name {
	case "after":
		return dur(&f.After)
	case "for":
		return dur(&f.For)
	case "gap":
		if err := only(FaultDrip, FaultHealthFlap); err != nil {
			return err
		}
		if err := dur(&f.Gap); err != nil {
			return err
		}
		if f.Gap <= 0 {
			return fmt.Errorf("fault %s: gap must be positive", f.Kind)
		}
		return nil
	case "events":
		if err := only(FaultDieMidStream, FaultStall); err != nil {
			return err
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 {
			return fmt.Errorf("fault %s: events=%q is not a count", f.Kind, value)
		}
		f.Events = n
		return nil
	case "framing":
		if err := only(FaultDieMidStream); err != nil {
			return err
		}
		if !slices.Contains(Framings(), Framing(value)) {
			return fmt.Errorf("fault %s: framing=%q is not cut, clean or close", f.Kind, value)
		}
		f.Framing = Framing(value)
		return nil
	case "share":
		if err := only(FaultDieMidStream); err != nil {
			return err
		}
		// !(x > 0) also refuses NaN.
		x, err := strconv.ParseFloat(value, 64)
		if err != nil || !(x > 0) || x > 1 {
			return fmt.Errorf("fault %s: share=%q is not a fraction above 0 and at most 1", f.Kind, value)
		}
		f.Share = x
		return nil
	case "status":
		if err := only(Fault5xx); err != nil {
			return err
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < 500 || n > 599 {
			return fmt.Errorf("fault %s: status=%q is not 500..599", f.Kind, value)
		}
		f.Status = n
		return nil
	case "bytes":
		if err := only(FaultMetricsHuge); err != nil {
			return err
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("fault %s: bytes=%q is not a size in bytes", f.Kind, value)
		}
		f.Bytes = n
		return nil
	}
	return fmt.Errorf("fault %s: unknown parameter %q", f.Kind, name)
}

// faultState is the faults a server shows and when they were set.
type faultState struct {
	faults Faults
	since  time.Time
}

// active returns the fault of kind k that shows at now, if any.
func (st *faultState) active(k FaultKind, now time.Time) (Fault, bool) {
	if st == nil {
		return Fault{}, false
	}
	for _, f := range st.faults {
		if f.Kind == k && st.on(f, now) {
			return f, true
		}
	}
	return Fault{}, false
}

func (st *faultState) on(f Fault, now time.Time) bool {
	start := st.since.Add(f.After)
	return !now.Before(start) && (f.For == 0 || now.Before(start.Add(f.For)))
}

// next returns the first moment after now at which a fault of kind k
// starts or ends, or the zero time when none will.
func (st *faultState) next(k FaultKind, now time.Time) time.Time {
	var t time.Time
	if st == nil {
		return t
	}
	for _, f := range st.faults {
		if f.Kind != k {
			continue
		}
		start := st.since.Add(f.After)
		for _, e := range []time.Time{start, start.Add(f.For)} {
			if e.After(now) && (f.For > 0 || e.Equal(start)) && (t.IsZero() || e.Before(t)) {
				t = e
			}
		}
	}
	return t
}

// SetFaults replaces the faults the server shows; their After and For
// count from now. Nil clears them. Safe to call at any time.
func (s *Server) SetFaults(fs Faults) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	s.faults.Store(&faultState{faults: slices.Clone(fs), since: time.Now()})
	close(s.faultsChanged)
	s.faultsChanged = make(chan struct{})
}

// Faults returns the faults set on the server, showing or not.
func (s *Server) Faults() Faults {
	if st := s.faults.Load(); st != nil {
		return slices.Clone(st.faults)
	}
	return nil
}

// fault returns the fault of kind k showing now, if any.
func (s *Server) fault(k FaultKind) (Fault, bool) {
	return s.faults.Load().active(k, time.Now())
}

// changed returns a channel closed at the next SetFaults.
func (s *Server) changed() <-chan struct{} {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	return s.faultsChanged
}

// serveFaults is the server's fault switch: GET shows the faults set, PUT
// (or POST) replaces them with the body, a list [ParseFaults] reads, and
// DELETE clears them.
func (s *Server) serveFaults(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPut, http.MethodPost:
		b, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fs, err := ParseFaults(string(b))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.SetFaults(fs)
	case http.MethodDelete:
		s.SetFaults(nil)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, s.Faults().String())
}

// withConnFaults wraps the server's routes with the close fault.
func (s *Server) withConnFaults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.fault(FaultClose); ok && r.URL.Path != "/sim/faults" {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
				return
			}
			panic(http.ErrAbortHandler) // HTTP/2: reset the stream instead
		}
		next.ServeHTTP(w, r)
	})
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errDie ends a generation that the die-mid-stream fault cuts.
var errDie = errors.New("emulated server died")

// faultyEmit wraps a's emit with the drip and stall faults showing when
// the request began, and with the die-mid-stream fault that took it, if
// any. A non-streamed answer that die-mid-stream frames clean or close
// runs whole: [writeAnswer] cuts its JSON.
func (s *Server) faultyEmit(ctx context.Context, a admitted, emit func() error) func() error {
	drip, dripping := s.fault(FaultDrip)
	stall, stalling := s.fault(FaultStall)
	var die Fault
	dying := a.die != nil && (a.stream || a.die.framing() == FramingCut)
	if dying {
		die = *a.die
	}
	if !dripping && !stalling && !dying {
		return emit
	}
	n := 0
	return func() error {
		if dying && n >= die.Events {
			return errDie
		}
		if stalling && n >= stall.Events {
			<-ctx.Done()
			return ctx.Err()
		}
		if dripping {
			if err := sleepCtx(ctx, drip.Gap); err != nil {
				return err
			}
		}
		n++
		return emit()
	}
}

// hijackRaw takes over w's connection for an answer delimited by it
// (die-mid-stream's close framing): it writes the status line 200 and
// w's header with Connection: close and neither Transfer-Encoding nor
// Content-Length, so that the body written after them ends where the
// connection does (RFC 9112 section 6.3, rule 8), as an HTTP/1.0-style
// server's or a proxy's that drops chunking. The caller writes the body to
// the returned writer, flushes it and closes the connection. It returns
// nil when w's connection cannot be taken over, as over HTTP/2.
func hijackRaw(w http.ResponseWriter) (net.Conn, *bufio.Writer) {
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil
	}
	h := w.Header().Clone()
	h.Del("Transfer-Encoding")
	h.Del("Content-Length")
	h.Set("Connection", "close")
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	bw := rw.Writer
	_, _ = bw.WriteString("HTTP/1.1 200 OK\r\n")
	_ = h.Write(bw)
	_, _ = bw.WriteString("\r\n")
	return conn, bw
}

// generationFault answers a generation that a 5xx, 429 or hang fault
// takes, writing errors with write, the route's API's error shape, and
// reports whether it did.
func (s *Server) generationFault(w http.ResponseWriter, r *http.Request, write func(http.ResponseWriter, *refusal)) bool {
	if f, ok := s.fault(Fault5xx); ok {
		write(w, &refusal{status: f.Status, typ: "InternalServerError", msg: "Emulated server error (sim fault 5xx)."})
		return true
	}
	if _, ok := s.fault(Fault429); ok {
		w.Header().Set("Retry-After", "1")
		write(w, &refusal{status: http.StatusTooManyRequests, typ: "TooManyRequestsError", msg: "Emulated overload (sim fault 429)."})
		return true
	}
	if _, ok := s.fault(FaultHang); ok {
		// net/http notices a client that left only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
		return true
	}
	return false
}

// metricsFault answers a metrics page that a metrics fault takes, and
// reports whether it did; page renders the real page.
func (s *Server) metricsFault(w http.ResponseWriter, r *http.Request, page func() string) bool {
	if _, ok := s.fault(FaultMetricsHang); ok {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
		return true
	}
	if _, ok := s.fault(FaultMetricsGarbage); ok {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = io.WriteString(w, "<html>\x00\x01 not {prometheus} text\n}}}{{{ 1 2 3\nvllm:num_requests_waiting{ NaN garbage\n")
		return true
	}
	if f, ok := s.fault(FaultMetricsHuge); ok {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if _, err := io.WriteString(w, page()); err != nil {
			return true
		}
		// One block of filler written again and again: the page is
		// meant to be too large to read, not to be parsed.
		for n := int64(0); n < f.Bytes; n += int64(len(hugeBlock)) {
			if _, err := w.Write(hugeBlock[:min(int64(len(hugeBlock)), f.Bytes-n)]); err != nil {
				return true
			}
		}
		return true
	}
	return false
}

// hugeBlock is metrics-huge's filler, 64 KiB of series lines.
var hugeBlock = func() []byte {
	var b []byte
	for i := 0; len(b) < 64<<10; i++ {
		b = fmt.Appendf(b, "sim_padding{series=\"%d\"} 1\n", i)
	}
	return b
}()

// healthy answers /health: 200, or 503 in the down half of a flap.
func (s *Server) healthy(w http.ResponseWriter, r *http.Request) {
	st := s.faults.Load()
	if f, ok := st.active(FaultHealthFlap, time.Now()); ok {
		since := time.Since(st.since.Add(f.After))
		if int64(since/f.Gap)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

// Listener wraps ln so the server can show the refuse fault: while it
// shows, the listening socket is closed (connections are refused) and every
// connection accepted through it is reset; when it ends, the server
// listens at the same address again. Serve the returned listener with the
// server's [Server.Handler]; closing it stops the watch.
func (s *Server) Listener(ln net.Listener) net.Listener {
	l := &faultListener{s: s, addr: ln.Addr(), ln: ln, conns: make(map[net.Conn]struct{}), wake: make(chan struct{}), done: make(chan struct{})}
	go l.watch()
	return l
}

// faultListener is a listener the refuse fault can close and reopen.
// Accept and Close may be called concurrently.
type faultListener struct {
	s    *Server
	addr net.Addr

	mu     sync.Mutex
	ln     net.Listener          // guarded by mu; nil while refusing
	conns  map[net.Conn]struct{} // guarded by mu; open accepted connections
	wake   chan struct{}         // guarded by mu; closed when ln changes
	closed bool                  // guarded by mu
	done   chan struct{}         // closed by Close
}

func (l *faultListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, net.ErrClosed
		}
		ln, wake := l.ln, l.wake
		l.mu.Unlock()
		if ln == nil {
			<-wake
			continue
		}
		c, err := ln.Accept()
		if err != nil {
			l.mu.Lock()
			refused := l.ln != ln && !l.closed
			l.mu.Unlock()
			if refused {
				continue
			}
			return nil, err
		}
		l.mu.Lock()
		if l.ln != ln { // accepted just as the fault began
			l.mu.Unlock()
			reset(c)
			continue
		}
		tc := &trackedConn{Conn: c, l: l}
		l.conns[tc] = struct{}{}
		l.mu.Unlock()
		return tc, nil
	}
}

func (l *faultListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.done)
	close(l.wake)
	if l.ln != nil {
		return l.ln.Close()
	}
	return nil
}

func (l *faultListener) Addr() net.Addr { return l.addr }

// watch closes and reopens the listener as the refuse fault begins and
// ends.
func (l *faultListener) watch() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		changed := l.s.changed()
		st := l.s.faults.Load()
		now := time.Now()
		_, refuse := st.active(FaultRefuse, now)
		wait := time.Hour
		if !l.sync(refuse) {
			wait = 100 * time.Millisecond // the address is taken: try again soon
		}
		if next := st.next(FaultRefuse, now); !next.IsZero() {
			wait = min(wait, time.Until(next))
		}
		timer.Reset(wait)
		select {
		case <-l.done:
			return
		case <-changed:
		case <-timer.C:
		}
	}
}

// sync makes the socket match the fault, closed while refusing and open
// otherwise, and reports whether it does.
func (l *faultListener) sync(refuse bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return true
	}
	switch {
	case refuse && l.ln != nil:
		l.ln.Close()
		l.ln = nil
		for c := range l.conns {
			reset(c.(*trackedConn).Conn)
		}
		clear(l.conns)
	case !refuse && l.ln == nil:
		// The port was ours a moment ago; if another process took it in
		// between, watch tries again.
		ln, err := net.Listen(l.addr.Network(), l.addr.String())
		if err != nil {
			return false
		}
		l.ln = ln
	default:
		return true
	}
	close(l.wake)
	l.wake = make(chan struct{})
	return true
}

// reset closes c with a TCP reset, as the kernel does for a killed
// process's connections.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// trackedConn leaves its listener's set when closed.
type trackedConn struct {
	net.Conn
	l *faultListener
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
