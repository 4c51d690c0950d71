package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestObserverJSONBody reads usage from a whole JSON answer, without
// prompt_tokens_details (SGLang, vLLM without --enable-prompt-tokens-details),
// as the hold reads it: the client gets the body unchanged, and a body
// that does not parse reports no usage (and reaches no client).
func TestObserverJSONBody(t *testing.T) {
	for _, c := range []struct {
		body       string
		wantStatus int
		wantUsage  bool
	}{
		{`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":3,"total_tokens":33,"prompt_tokens_details":null}}`, 200, true},
		{`{"oops"`, 502, false},
	} {
		backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, c.body)
		}))
		f := newFront(t, DefaultConfig(), backend.URL)
		resp, err := http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(iotest.OneByteReader(resp.Body))
		resp.Body.Close()
		f.waitHandler(t, 1)
		if resp.StatusCode != c.wantStatus || c.wantUsage && string(got) != c.body {
			t.Errorf("%s: %d %s; want %d and the body unchanged", c.body, resp.StatusCode, got, c.wantStatus)
		}
		prompt := testutil.ToFloat64(f.metric(t).promptTokens.WithLabelValues(backend.URL, testModel))
		cached := testutil.ToFloat64(f.metric(t).cachedTokens.WithLabelValues(backend.URL, testModel))
		if c.wantUsage && (prompt != 30 || cached != 0) || !c.wantUsage && prompt != 0 {
			t.Errorf("%s: prompt tokens %v, cached %v counted", c.body, prompt, cached)
		}
		backend.Close()
	}
}

// TestWithUsage asks for the usage chunk and keeps every other byte and
// every other stream option.
func TestWithUsage(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"model":"m","stream":true}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"model":"m", "stream":true }`, `{"model":"m", "stream":true ,"stream_options":{"include_usage":true}}`},
		{`{"model":"m","stream_options":{"include_usage":false,"continuous_usage_stats":true},"stream":true}`,
			`{"model":"m","stream_options":{"continuous_usage_stats":true,"include_usage":true},"stream":true}`},
		{`{"stream_options":null,"model":"m"}`, `{"stream_options":{"include_usage":true},"model":"m"}`},
		{`{}`, `{"stream_options":{"include_usage":true}}`},
	} {
		req, err := ParseRequest(KindOther, []byte(c.in))
		var opts []byte
		if err == nil {
			opts = req.StreamOptions
		}
		b, err := withUsage([]byte(c.in), opts)
		got := string(b.head) + string(b.tail)
		if err != nil || got != c.want {
			t.Errorf("%s: got %s (%v), want %s", c.in, got, err, c.want)
		}
	}
	if _, err := withUsage([]byte(`[1]`), nil); err == nil {
		t.Error("a JSON array accepted")
	}
}
