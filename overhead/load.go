package overhead

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/llmlb/llmlb/bench"
)

// Load is a closed-loop HTTP load: Clients connections each POST Body to
// URL again as soon as the last answer is read, for Duration, or
// PerClient times each. It is the client side of the overhead benchmark
// (`llmlb overhead`), which runs the same Load against a backend directly
// and through each proxy.
type Load struct {
	URL  string
	Body []byte
	// Bodies, if set, gives client i the body Bodies[i%len(Bodies)]
	// instead of Body: clients whose prompts share no prefix.
	Bodies   [][]byte
	Stream   bool // read the answer as server-sent events, timing each
	Clients  int
	Duration time.Duration
	// PerClient, if above 0, is how many requests each client sends;
	// Duration is then ignored.
	PerClient int
	// Header is sent with every request; SessionHeader, if set, names a
	// header each client sends its own value of ("client-N").
	Header        http.Header
	SessionHeader string
}

// LoadResult is what a Load measured. Latencies are sorted.
type LoadResult struct {
	Requests int           // answered with 200 and read to the end
	Errors   int           // anything else
	FirstErr string        // the first error, for the report
	Elapsed  time.Duration // from the first request to the last answer
	// Latency is each request's time to its whole answer; TTFT (streams)
	// to its first event carrying a token; Gaps the time between a
	// stream's consecutive token events.
	Latency, TTFT, Gaps []time.Duration
	Events              int64 // token events read, over all streams
}

// Run sends the load until Duration has passed (requests under way then
// finish) or ctx ends.
func (l Load) Run(ctx context.Context) LoadResult {
	tr := &http.Transport{MaxIdleConnsPerHost: l.Clients, MaxConnsPerHost: l.Clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var (
		mu  sync.Mutex
		res LoadResult
		wg  sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(l.Duration)
	for i := range max(1, l.Clients) {
		body := l.Body
		if len(l.Bodies) > 0 {
			body = l.Bodies[i%len(l.Bodies)]
		}
		session := "client-" + strconv.Itoa(i)
		wg.Go(func() {
			var mine LoadResult
			for n := 0; ctx.Err() == nil; n++ {
				if l.PerClient > 0 && n == l.PerClient || l.PerClient <= 0 && !time.Now().Before(deadline) {
					break
				}
				l.one(ctx, client, body, session, &mine)
			}
			mu.Lock()
			res.Requests += mine.Requests
			res.Errors += mine.Errors
			if res.FirstErr == "" {
				res.FirstErr = mine.FirstErr
			}
			res.Latency = append(res.Latency, mine.Latency...)
			res.TTFT = append(res.TTFT, mine.TTFT...)
			res.Gaps = append(res.Gaps, mine.Gaps...)
			res.Events += mine.Events
			mu.Unlock()
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	slices.Sort(res.Latency)
	slices.Sort(res.TTFT)
	slices.Sort(res.Gaps)
	return res
}

// one sends body, with the client's session, and records the answer in r.
func (l Load) one(ctx context.Context, client *http.Client, body []byte, session string, r *LoadResult) {
	fail := func(err error) {
		r.Errors++
		if r.FirstErr == "" {
			r.FirstErr = err.Error()
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.URL, bytes.NewReader(body))
	if err != nil {
		fail(err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range l.Header {
		req.Header[k] = vs
	}
	if l.SessionHeader != "" {
		req.Header.Set(l.SessionHeader, session)
	}
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		fail(err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		fail(fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b)))
		return
	}
	if !l.Stream {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			fail(err)
			return
		}
		r.Requests++
		r.Latency = append(r.Latency, time.Since(t0))
		return
	}
	var last time.Time
	_, err = bench.ReadStream(resp.Body, func() {
		now := time.Now()
		if last.IsZero() {
			r.TTFT = append(r.TTFT, now.Sub(t0))
		} else {
			r.Gaps = append(r.Gaps, now.Sub(last))
		}
		last = now
		r.Events++
	})
	if err != nil {
		fail(err)
		return
	}
	r.Requests++
	r.Latency = append(r.Latency, time.Since(t0))
}
