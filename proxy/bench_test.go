package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy/stream"
	"github.com/llmlb/llmlb/tracing"
)

// chatBody returns a chat request whose user message is about tokens tokens
// of text (four bytes a token).
func chatBody(tokens int) []byte {
	return fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":%q}],"stream":true,"max_tokens":64}`,
		testModel, strings.Repeat("word ", tokens*4/5))
}

func BenchmarkParseRequest(b *testing.B) {
	for _, tokens := range []int{4 << 10, 32 << 10, 128 << 10} {
		body := chatBody(tokens)
		b.Run(fmt.Sprintf("chat-%dk-tokens", tokens>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseRequest(KindChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkProxy sends requests through the whole front (chi, parsing,
// pick on the default policy, ReverseProxy, a loopback connection) to a
// backend that answers at once, as the overhead llmlb adds per request on
// this machine. The 220 KB case is issue 19's agent prompt.
func BenchmarkProxy(b *testing.B) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.Path, "chat") {
			w.Header().Set("Content-Type", "text/event-stream")
			for range 16 {
				io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}`+"\n\n")
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"index":0,"text":" ok","finish_reason":"length"}]}`)
	}))
	defer backend.Close()
	bal := newBal(b, balancer.DefaultConfig().Policy)
	bu, _ := url.Parse(backend.URL)
	bal.Update(balancer.Spec{ID: backend.URL, URL: bu, Engine: "vllm", Models: []string{testModel}, State: balancer.StateReady,
		Metrics: balancer.Metrics{Queued: balancer.Known(0), Running: balancer.Known(0), KVUsage: balancer.Known(0.1), At: time.Now()}})
	front := httptest.NewServer(newServer(b, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry()}).Handler())
	defer front.Close()
	// The same front with tracing on: every request sampled, its spans
	// batched to an OTLP/HTTP collector that takes them and answers.
	collector := httptest.NewServer(&otlpReceiver{discard: true})
	defer collector.Close()
	tp, shutdown, err := tracing.Start(tracing.Config{Endpoint: collector.URL, SampleRatio: 1, Propagate: true})
	if err != nil {
		b.Fatal(err)
	}
	defer shutdown(context.Background())
	traced := httptest.NewServer(newServer(b, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry(), Tracer: tp}).Handler())
	defer traced.Close()
	// The baseline: Go's reverse proxy alone, with no parsing, routing or
	// observing, in front of the same backend.
	bare := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(bu) },
		Transport: &http.Transport{MaxIdleConnsPerHost: 64}})
	defer bare.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	completion := fmt.Appendf(nil, `{"model":%q,"prompt":"hello","max_tokens":1}`, testModel)
	for _, tc := range []struct {
		name, front, path string
		body              []byte
	}{
		{"completion", front.URL, "/v1/completions", completion},
		{"completion-traced", traced.URL, "/v1/completions", completion},
		{"completion-bare-httputil-reverseproxy", bare.URL, "/v1/completions", completion},
		{"chat-stream-16-events-4k-prompt", front.URL, "/v1/chat/completions", chatBody(4 << 10)},
		{"chat-stream-16-events-4k-prompt-traced", traced.URL, "/v1/chat/completions", chatBody(4 << 10)},
		{"chat-stream-16-events-220KB-prompt", front.URL, "/v1/chat/completions", chatBody(220 << 10 / 4)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, tc.front+tc.path, strings.NewReader(string(tc.body)))
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
			})
		})
	}
}

// BenchmarkAuthenticate: finding a request's key among n configured
// ones: one SHA-256 and n constant-time comparisons.
func BenchmarkAuthenticate(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprint(n, "-keys"), func(b *testing.B) {
			s := newServer(b, Options{Config: DefaultConfig(), Balancer: newTestBalancer(b), Registerer: prometheus.NewRegistry()})
			var ac AuthConfig
			for i := range n {
				ac.Keys = append(ac.Keys, keyConfig(fmt.Sprint("k", i), fmt.Sprint("sk-bench-key-", i)))
			}
			if err := s.SetAuth(ac); err != nil {
				b.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
			r.Header.Set("Authorization", "Bearer sk-bench-key-"+fmt.Sprint(n/2))
			b.ReportAllocs()
			for b.Loop() {
				if t, err := s.authenticate(r); err != nil || t == nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkObserver reads the usage of a held JSON completion, as the
// hold does.
func BenchmarkObserver(b *testing.B) {
	body := []byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" ok","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1,"prompt_tokens_details":null}}`)
	b.ReportAllocs()
	for b.Loop() {
		if !stream.BodyUsage(stream.Completions, body).Known {
			b.Fatal("usage not read")
		}
	}
}

// streamEvents is a vLLM chat stream of n content events, each carrying
// "usage": null (vLLM with include_usage), then its usage chunk and
// [DONE], as llmlb forwards them.
func streamEvents(n int) string {
	var s strings.Builder
	s.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"target","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	for i := range n {
		finish := "null"
		if i == n-1 {
			finish = `"length"`
		}
		fmt.Fprintf(&s, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"target","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":%s}],"usage":null}`+"\n\n", finish)
	}
	fmt.Fprintf(&s, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"target","choices":[],"usage":{"prompt_tokens":12,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":8}}}`+"\n\ndata: [DONE]\n\n", 12+n, n)
	return s.String()
}

// BenchmarkStreamEvent reads a 50-event chat stream through every stage a
// streamed answer passes on its way to the client (continuation
// bookkeeping, the model name's rewrite, usage, timing and the usage
// strip), in 16 KB reads as ReverseProxy makes them; ns/event is the cost
// of one event.
func BenchmarkStreamEvent(b *testing.B) {
	const events = 50
	in := streamEvents(events)
	buf := make([]byte, 16<<10)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		r, usage := streamPipeline(io.NopCloser(strings.NewReader(in)))
		for {
			if _, err := r.Read(buf); err != nil {
				break
			}
		}
		if u := usage(); !u.Known || u.TokenEvents < events {
			b.Fatalf("usage %+v", u)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(events+3)), "ns/event")
}

// streamPipeline wraps src in the stream stages as the proxy does for a
// continuable chat stream whose model was routed to another name and whose
// usage chunk llmlb asked for.
func streamPipeline(src io.ReadCloser) (io.Reader, func() stream.Usage) {
	r := stream.NewReader(src, stream.Options{API: stream.Chat, Strip: true, Edit: modelEdit("target", "public"),
		OnGap: func(time.Duration) {}, Resume: &resumer{}, Continuations: 2})
	return r, r.Usage
}
