package proxy

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/llmlb/llmlb/tracing"
)

// otlpReceiver is an OTLP/HTTP collector in-process: it keeps every span
// posted to /v1/traces.
type otlpReceiver struct {
	discard bool // keep nothing (a benchmark's)
	mu      sync.Mutex
	spans   []*tracepb.Span
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		if o.discard {
			break
		}
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func attr(sp *tracepb.Span, key string) string {
	for _, kv := range sp.Attributes {
		if kv.Key == key {
			v := kv.Value
			switch {
			case v.GetStringValue() != "":
				return v.GetStringValue()
			case v.GetIntValue() != 0:
				return itoa(v.GetIntValue())
			}
		}
	}
	return ""
}

// TestTracesReachACollector: a client's trace context reaches the server
// with the same trace id; with a tracer, llmlb's request span continues
// the client's trace, the pick and the attempt are its children, the
// spans reach an OTLP/HTTP receiver, and the server's parent span is the
// attempt's.
func TestTracesReachACollector(t *testing.T) {
	var got []string // traceparents the server saw
	var mu sync.Mutex
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Traceparent"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}))
	defer backend.Close()
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	send := func(f *testFront) {
		req, _ := http.NewRequest("POST", f.URL+"/v1/completions", strings.NewReader(`{"model":"`+testModel+`","prompt":"hi"}`))
		req.Header.Set("Traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		f.waitHandler(t, 1)
	}

	// Without a tracer the client's context passes as it came.
	send(newFront(t, DefaultConfig(), backend.URL))
	if len(got) != 1 || got[0] != "00-"+clientTrace+"-"+clientSpan+"-01" {
		t.Fatalf("without tracing the server saw traceparent %q", got)
	}

	rcv := &otlpReceiver{}
	collector := httptest.NewServer(rcv)
	defer collector.Close()
	tp, shutdown, err := tracing.Start(tracing.Config{Endpoint: collector.URL, SampleRatio: 1, Propagate: true})
	if err != nil {
		t.Fatal(err)
	}
	bal := newTestBalancer(t, backend.URL)
	px := newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry(), Tracer: tp})
	h := px.Handler()
	done := make(chan struct{}, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { done <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	send(&testFront{Server: srv, bal: bal, handlerDone: done})
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	byName := map[string]*tracepb.Span{}
	for _, sp := range rcv.spans {
		byName[sp.Name] = sp
		if hex.EncodeToString(sp.TraceId) != clientTrace {
			t.Errorf("span %s in trace %x, want the client's %s", sp.Name, sp.TraceId, clientTrace)
		}
	}
	req, pick, att := byName["llmlb.request"], byName["llmlb.pick"], byName["llmlb.attempt"]
	if req == nil || pick == nil || att == nil {
		t.Fatalf("spans %v; want llmlb.request, llmlb.pick and llmlb.attempt", byName)
	}
	if hex.EncodeToString(req.ParentSpanId) != clientSpan {
		t.Errorf("the request span's parent is %x, want the client's %s", req.ParentSpanId, clientSpan)
	}
	for _, sp := range []*tracepb.Span{pick, att} {
		if string(sp.ParentSpanId) != string(req.SpanId) {
			t.Errorf("%s's parent is %x, want the request span %x", sp.Name, sp.ParentSpanId, req.SpanId)
		}
	}
	want := "00-" + clientTrace + "-" + hex.EncodeToString(att.SpanId) + "-01"
	if len(got) != 2 || got[1] != want {
		t.Errorf("the server saw traceparent %q, want %q (the attempt span its parent)", got, want)
	}
	for _, c := range []struct {
		sp        *tracepb.Span
		key, want string
	}{
		{req, "llmlb.model", testModel}, {req, "http.response.status_code", "200"}, {req, "llmlb.prompt_tokens", "3"},
		{pick, "llmlb.reason", "least-load"}, {att, "http.response.status_code", "200"},
	} {
		if g := attr(c.sp, c.key); g != c.want {
			t.Errorf("%s %s = %q, want %q", c.sp.Name, c.key, g, c.want)
		}
	}
}
