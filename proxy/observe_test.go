package proxy

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/llmlb/llmlb/proxy/stream"
)

func readObserved(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestObserverJSONBody reads usage from a whole JSON answer, without
// prompt_tokens_details (SGLang, vLLM without --enable-prompt-tokens-details).
func TestObserverJSONBody(t *testing.T) {
	body := `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":3,"total_tokens":33,"prompt_tokens_details":null}}`
	o := newJSONObserver(io.NopCloser(iotest.OneByteReader(strings.NewReader(body))), stream.Chat)
	if got := readObserved(t, o); got != body {
		t.Fatalf("body changed: %s", got)
	}
	if u := o.Usage(); !u.Known || u.Prompt != 30 || u.Completion != 3 || u.CachedKnown {
		t.Errorf("usage %+v", u)
	}
	o = newJSONObserver(io.NopCloser(strings.NewReader(`{"oops"`)), stream.Chat)
	readObserved(t, o)
	if o.Usage().Known {
		t.Error("usage from a broken body")
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
