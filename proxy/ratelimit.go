package proxy

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// limiter holds one API key's requests-per-minute and tokens-per-minute
// limits, each a bucket that holds a minute's allowance and refills
// continuously at the limit's rate: a key that used its whole minute at
// once may send again as the allowance comes back, and a key quiet for a
// minute has all of it. Its methods may be called concurrently.
type limiter struct {
	mu       sync.Mutex
	requests bucket // guarded by mu
	tokens   bucket // guarded by mu
}

// bucket is one limit, kept as the time its allowance will be whole
// again (the generic cell rate algorithm): each unit used pushes that
// time a minute/limit further, so every figure is exact in whole
// nanoseconds. The zero bucket is unlimited.
type bucket struct {
	limit int           // per minute, and the most the bucket holds; 0: unlimited
	per   time.Duration // what one unit takes to come back: a minute over limit
	full  time.Time     // when the allowance is whole again; at or before now, it is
}

// maxDebt bounds how far a bucket may be from whole (about 146 years),
// so that no figure overflows whatever a backend reports as usage.
const maxDebt = time.Duration(1 << 62)

// span is what n units take to come back, within ±maxDebt.
func (b *bucket) span(n int) time.Duration {
	lim := int64(maxDebt / b.per)
	return time.Duration(max(-lim, min(int64(n), lim))) * b.per
}

// used is how far b is from whole at now, as the time it takes to refill.
func (b *bucket) used(now time.Time) time.Duration { return max(0, b.full.Sub(now)) }

// wait is how long until b holds n units.
func (b *bucket) wait(now time.Time, n int) time.Duration {
	return max(0, b.used(now)+b.span(n)-time.Minute)
}

// take uses n units (gives them back when n is negative); b may go into
// debt, past a minute of refill.
func (b *bucket) take(now time.Time, n int) {
	b.full = now.Add(min(max(0, b.used(now)+b.span(n)), maxDebt))
}

// remaining is the whole units b holds at now.
func (b *bucket) remaining(now time.Time) int {
	return max(0, int((time.Minute-b.used(now))/b.per))
}

// state is what the x-ratelimit-* headers say of b at now.
func (b *bucket) state(now time.Time) *limitState {
	if b.limit == 0 {
		return nil
	}
	return &limitState{limit: b.limit, remaining: b.remaining(now), reset: b.used(now)}
}

// limitState is one limit as the client is told it.
type limitState struct {
	limit, remaining int
	reset            time.Duration // until the allowance is whole again
}

// quota is a key's limits as they stand after an admission.
type quota struct {
	requests, tokens *limitState // nil: unlimited
}

// setLimits sets the limits per minute (0: unlimited), keeping what is
// left of the allowance: a lower limit caps it.
func (l *limiter) setLimits(now time.Time, requests, tokens int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range []struct {
		b *bucket
		n int
	}{{&l.requests, requests}, {&l.tokens, tokens}} {
		if c.n == c.b.limit {
			continue
		}
		left := c.n
		if c.b.limit > 0 {
			left = min(left, c.b.remaining(now))
		}
		*c.b = bucket{limit: c.n}
		if c.n > 0 {
			c.b.per = time.Minute / time.Duration(c.n)
			c.b.take(now, c.n-left)
		}
	}
}

// limits returns the limits per minute, 0 for unlimited.
func (l *limiter) limits() (requests, tokens int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.requests.limit, l.tokens.limit
}

// rateLimitError is a request refused because its key is over a limit.
type rateLimitError struct {
	kind  string // "requests" or "tokens", as OpenAI's error type says
	limit int
	wait  time.Duration // until the request would be admitted
}

func (e *rateLimitError) Error() string {
	return fmt.Sprintf("over %d %s per minute; admitted in %s", e.limit, e.kind, e.wait)
}

// admit takes one request and an estimate of its tokens from the key's
// allowance, or neither when either falls short, then the answer is a
// [*rateLimitError]. A request estimated larger than the whole token limit
// is admitted when the allowance is full, and leaves it in debt, rather
// than never. The quota is the limits after this admission.
func (l *limiter) admit(now time.Time, tokens int) (quota, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if r := &l.requests; r.limit > 0 {
		if w := r.wait(now, 1); w > 0 {
			err = &rateLimitError{kind: "requests", limit: r.limit, wait: w}
		}
	}
	if t := &l.tokens; t.limit > 0 && err == nil {
		if w := t.wait(now, min(tokens, t.limit)); w > 0 {
			err = &rateLimitError{kind: "tokens", limit: t.limit, wait: w}
		}
	}
	if err == nil && l.requests.limit > 0 {
		l.requests.take(now, 1)
	}
	if err == nil && l.tokens.limit > 0 {
		l.tokens.take(now, tokens)
	}
	return quota{requests: l.requests.state(now), tokens: l.tokens.state(now)}, err
}

// charge takes n more tokens (or gives them back, n negative) once a
// request's real use is known.
func (l *limiter) charge(now time.Time, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tokens.limit > 0 {
		l.tokens.take(now, n)
	}
}

// setHeaders writes q as the x-ratelimit-* headers OpenAI sends and its
// clients read.
func (q quota) setHeaders(h http.Header) {
	for _, c := range []struct {
		kind string
		st   *limitState
	}{{"requests", q.requests}, {"tokens", q.tokens}} {
		if c.st == nil {
			continue
		}
		h.Set("X-Ratelimit-Limit-"+c.kind, strconv.Itoa(c.st.limit))
		h.Set("X-Ratelimit-Remaining-"+c.kind, strconv.Itoa(c.st.remaining))
		h.Set("X-Ratelimit-Reset-"+c.kind, c.st.reset.Round(time.Millisecond).String())
	}
}
