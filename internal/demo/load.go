package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/bench"
	"github.com/llmlb/llmlb/proxy"
)

// Load sends chat traffic through a balancer: Concurrency clients, each
// sending one streaming request after another until ctx ends. Prompts come
// from a few tenants, each with a long system prompt shared by its users, so
// prefix-aware routing has something to find.
type Load struct {
	// URL is the balancer's base URL, e.g. http://127.0.0.1:8080.
	URL string
	// Model is the model name sent.
	Model string
	// Concurrency is the number of clients. (default 8)
	Concurrency int
	// Tenants is the number of distinct system prompts. (default 4)
	Tenants int
	// MaxTokens is each request's max_tokens. (default 32)
	MaxTokens int
	// Seed makes prompts reproducible.
	Seed uint64
	// Client sends the requests; nil means a client with no proxy.
	Client *http.Client

	mu      sync.Mutex
	results LoadResults // guarded by mu
}

// LoadResults are what a [Load] has measured so far, client side.
type LoadResults struct {
	OK, Failed   int
	ByBackend    map[string]int  // x-llmlb-backend of each answer
	TTFT         []time.Duration // time to the first content event, OK requests
	OutputTokens int
	LastError    string
}

// Results returns a copy of the results so far.
func (l *Load) Results() LoadResults {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.results
	r.ByBackend = make(map[string]int, len(l.results.ByBackend))
	for k, v := range l.results.ByBackend {
		r.ByBackend[k] = v
	}
	r.TTFT = slices.Clone(l.results.TTFT)
	return r
}

// Run sends traffic until ctx ends.
func (l *Load) Run(ctx context.Context) {
	if l.Concurrency <= 0 {
		l.Concurrency = 8
	}
	if l.Tenants <= 0 {
		l.Tenants = 4
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = 32
	}
	if l.Client == nil {
		l.Client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: l.Concurrency}}
	}
	l.mu.Lock()
	l.results.ByBackend = map[string]int{}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for i := range l.Concurrency {
		rng := rand.New(rand.NewPCG(l.Seed, uint64(i)))
		wg.Go(func() {
			for ctx.Err() == nil {
				l.one(ctx, rng)
			}
		})
	}
	wg.Wait()
	// A connection dialled for a request that ctx then cancelled stays in
	// the client's pool unused, and a server shutting down waits for such
	// a connection, which never sent a request, for 5 s before counting it
	// idle (net/http, Server.Shutdown): close them all now that nothing is
	// sent. Without this the demo's balancer, whose grace is 5 s, warned
	// "grace period over" when make test ran it under load.
	l.Client.CloseIdleConnections()
}

// systemPrompt is tenant t's long shared instructions, about 4,000 tokens.
func systemPrompt(t int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "You are the assistant of tenant %d. ", t)
	for i := 0; b.Len() < 16000; i++ {
		fmt.Fprintf(&b, "Rule %d of tenant %d: answer briefly, cite sources, and keep to the topic. ", i, t)
	}
	return b.String()
}

func (l *Load) one(ctx context.Context, rng *rand.Rand) {
	tenant := rng.IntN(l.Tenants)
	body, _ := json.Marshal(map[string]any{
		"model": l.Model,
		"messages": []map[string]string{
			{"role": "system", "content": systemPrompt(tenant)},
			{"role": "user", "content": fmt.Sprintf("Question %d: what is %d times %d?", rng.Uint32(), rng.IntN(100), rng.IntN(100))},
		},
		"max_tokens":     l.MaxTokens,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.URL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		l.fail(err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := l.Client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			l.fail(err)
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		l.fail(fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg)))
		return
	}
	var ttft time.Duration
	usage, err := bench.ReadStream(resp.Body, func() {
		if ttft == 0 {
			ttft = time.Since(start)
		}
	})
	if err != nil {
		if ctx.Err() == nil {
			l.fail(err)
		}
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.results.OK++
	l.results.ByBackend[resp.Header.Get(proxy.HeaderBackend)]++
	l.results.TTFT = append(l.results.TTFT, ttft)
	l.results.OutputTokens += usage.Completion
}

func (l *Load) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.results.Failed++
	l.results.LastError = err.Error()
}
