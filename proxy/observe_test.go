package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

const vllmStream = `data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"Hel","logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"lo","logprobs":null,"finish_reason":"length"}],"usage":null}

data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":14,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}

data: [DONE]

`

// fakeClock ticks a millisecond per call.
func fakeClock() func() time.Time {
	t := time.Unix(0, 0)
	return func() time.Time { t = t.Add(time.Millisecond); return t }
}

func readObserved(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestObserverStripsInjectedUsage: the usage chunk llmlb asked for is read
// and taken out of the stream; everything else reaches the client as the
// backend sent it, however the reads are split.
func TestObserverStripsInjectedUsage(t *testing.T) {
	for _, split := range []bool{false, true} {
		var src io.Reader = strings.NewReader(vllmStream)
		if split {
			src = iotest.OneByteReader(src)
		}
		var gaps []time.Duration
		o := newObserver(io.NopCloser(src), KindChat, true, true, fakeClock(), func(d time.Duration) { gaps = append(gaps, d) })
		got := readObserved(t, o)
		want := strings.Replace(vllmStream, vllmStream[strings.Index(vllmStream, `data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],`):strings.Index(vllmStream, "data: [DONE]")], "", 1)
		if got != want {
			t.Errorf("split %v: client got\n%s\nwant\n%s", split, got, want)
		}
		u := o.Usage()
		if !u.Known || u.Prompt != 12 || u.Completion != 2 || !u.CachedKnown || u.Cached != 8 || u.TokenEvents != 2 || u.FirstToken.IsZero() {
			t.Errorf("usage %+v", u)
		}
		if len(gaps) != 1 || gaps[0] != time.Millisecond {
			t.Errorf("gaps %v", gaps)
		}
	}
}

// TestObserverPassesClientUsage: when the client asked for usage itself,
// the stream is unchanged, CRLF event ends included, and still read.
func TestObserverPassesClientUsage(t *testing.T) {
	crlf := strings.ReplaceAll(vllmStream, "\n", "\r\n")
	for _, in := range []string{vllmStream, crlf} {
		o := newObserver(io.NopCloser(iotest.HalfReader(strings.NewReader(in))), KindChat, true, false, fakeClock(), nil)
		if got := readObserved(t, o); got != in {
			t.Errorf("stream changed:\n%q\n%q", got, in)
		}
		if u := o.Usage(); !u.Known || u.Cached != 8 || u.TokenEvents != 2 {
			t.Errorf("usage %+v", u)
		}
	}
}

// TestObserverJSONBody reads usage from a whole JSON answer, without
// prompt_tokens_details (SGLang, vLLM without --enable-prompt-tokens-details).
func TestObserverJSONBody(t *testing.T) {
	body := `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":3,"total_tokens":33,"prompt_tokens_details":null}}`
	o := newObserver(io.NopCloser(iotest.OneByteReader(strings.NewReader(body))), KindChat, false, false, fakeClock(), nil)
	if got := readObserved(t, o); got != body {
		t.Fatalf("body changed: %s", got)
	}
	if u := o.Usage(); !u.Known || u.Prompt != 30 || u.Completion != 3 || u.CachedKnown {
		t.Errorf("usage %+v", u)
	}
	o = newObserver(io.NopCloser(strings.NewReader(`{"oops"`)), KindChat, false, false, fakeClock(), nil)
	readObserved(t, o)
	if o.Usage().Known {
		t.Error("usage from a broken body")
	}
}

// TestObserverErrorsAndCuts: an error event is no token; a stream cut
// mid-event hands over the whole events and then the error.
func TestObserverErrorsAndCuts(t *testing.T) {
	in := "data: {\"error\":{\"message\":\"boom\"}}\n\ndata: {\"choices\":[{\"te"
	o := newObserver(io.NopCloser(iotest.TimeoutReader(strings.NewReader(in))), KindChat, true, true, fakeClock(), nil)
	b := make([]byte, 4096)
	n, err := o.Read(b)
	if err != nil || !bytes.HasPrefix(b[:n], []byte(`data: {"error"`)) {
		t.Fatalf("first read %q %v", b[:n], err)
	}
	for err == nil {
		_, err = o.Read(b)
	}
	if err != iotest.ErrTimeout {
		t.Errorf("error %v, want the source's", err)
	}
	if u := o.Usage(); u.TokenEvents != 0 {
		t.Errorf("token events %d", u.TokenEvents)
	}
}

// FuzzObserver: without stripping, the client gets exactly the backend's
// bytes, whatever they are; with it, never more, and nothing panics.
func FuzzObserver(f *testing.F) {
	f.Add([]byte(vllmStream), true)
	f.Add([]byte(strings.ReplaceAll(vllmStream, "\n", "\r\n")), false)
	f.Add([]byte(`{"usage":{"prompt_tokens":1}}`), false)
	f.Add([]byte("data: {\"usage\":{}}\n\n\n\ndata:\n\n"), true)
	f.Fuzz(func(t *testing.T, in []byte, sse bool) {
		o := newObserver(io.NopCloser(iotest.HalfReader(bytes.NewReader(in))), KindChat, sse, false, fakeClock(), func(time.Duration) {})
		got, err := io.ReadAll(o)
		if err != nil || !bytes.Equal(got, in) {
			t.Fatalf("passthrough changed the bytes (%v):\n%q\n%q", err, got, in)
		}
		o = newObserver(io.NopCloser(bytes.NewReader(in)), KindChat, sse, true, fakeClock(), nil)
		got, err = io.ReadAll(o)
		if err != nil || len(got) > len(in) {
			t.Fatalf("strip grew the stream (%v): %d > %d", err, len(got), len(in))
		}
	})
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

// TestObserverKeepsDoneAfterStrippedUsage is issue 18's ninth problem: a
// backend that sends its usage chunk and [DONE] in one event (two data lines
// with no blank line between) lost the [DONE] with the usage chunk llmlb
// strips. Only the usage line goes; an event with other lines keeps them.
func TestObserverKeepsDoneAfterStrippedUsage(t *testing.T) {
	const token = `data: {"id":"c","choices":[{"index":0,"text":"hi"}],"usage":null}` + "\n\n"
	const usage = `data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	tests := []struct {
		name, in, want string
	}{
		{"usage and DONE in one event", token + usage + "\ndata: [DONE]\n\n", token + "data: [DONE]\n\n"},
		{"CRLF lines", token + usage + "\r\ndata: [DONE]\r\n\r\n", token + "data: [DONE]\r\n\r\n"},
		{"id line kept with DONE", token + "id: 7\n" + usage + "\ndata: [DONE]\n\n", token + "id: 7\ndata: [DONE]\n\n"},
		{"usage alone, then DONE", token + usage + "\n\ndata: [DONE]\n\n", token + "data: [DONE]\n\n"},
		{"DONE unterminated at EOF", token + usage + "\ndata: [DONE]", token + "data: [DONE]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, split := range []bool{false, true} {
				var src io.Reader = strings.NewReader(tc.in)
				if split {
					src = iotest.OneByteReader(src)
				}
				o := newObserver(io.NopCloser(src), KindChat, true, true, fakeClock(), nil)
				if got := readObserved(t, o); got != tc.want {
					t.Errorf("split %v: client got %q, want %q", split, got, tc.want)
				}
				if u := o.Usage(); !u.Known || u.Prompt != 3 || u.Completion != 1 || u.TokenEvents != 1 {
					t.Errorf("split %v: usage %+v", split, u)
				}
			}
		})
	}
}

// TestObserverSmallReads: the observer reads the backend into the
// caller's buffer, so a caller that reads a few bytes at a time (or asks
// for none) gets the same stream, usage chunk stripped, as one that reads
// it whole.
func TestObserverSmallReads(t *testing.T) {
	whole := readObserved(t, newObserver(io.NopCloser(strings.NewReader(vllmStream)), KindChat, true, true, fakeClock(), nil))
	for _, size := range []int{1, 5, 64} {
		o := newObserver(io.NopCloser(strings.NewReader(vllmStream)), KindChat, true, true, fakeClock(), nil)
		var got []byte
		p := make([]byte, size)
		for {
			if n, err := o.Read(p[:0]); n != 0 || err != nil {
				t.Fatalf("empty read: %d, %v", n, err)
			}
			n, err := o.Read(p)
			got = append(got, p[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if string(got) != whole {
			t.Errorf("%d-byte reads got\n%s\nwant\n%s", size, got, whole)
		}
		if u := o.Usage(); !u.Known || u.Completion != 2 {
			t.Errorf("%d-byte reads: usage %+v", size, u)
		}
	}
}

// FuzzScanChunk: where the fast readers of a stream chunk and of a usage
// object answer, they answer what encoding/json does.
func FuzzScanChunk(f *testing.F) {
	f.Add([]byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}`))
	f.Add([]byte(`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2},"Choices":null}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1e3,"prompt_tokens_details":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		choices, u, ok := scanChunk(data)
		if ok {
			var c struct {
				Choices []json.RawMessage `json:"choices"`
				Usage   *wireUsage        `json:"usage"`
			}
			if err := json.Unmarshal(data, &c); err != nil {
				t.Fatalf("scanChunk took %q, encoding/json: %v", data, err)
			}
			if choices != len(c.Choices) || !reflect.DeepEqual(u, c.Usage) {
				t.Fatalf("scanChunk(%q) = %d, %+v; encoding/json %d, %+v", data, choices, u, len(c.Choices), c.Usage)
			}
		}
		var su *wireUsage
		if scanUsage(data, &su) {
			var ju *wireUsage
			if err := json.Unmarshal(data, &ju); err != nil {
				t.Fatalf("scanUsage took %q, encoding/json: %v", data, err)
			}
			if !reflect.DeepEqual(su, ju) {
				t.Fatalf("scanUsage(%q) = %+v, encoding/json %+v", data, su, ju)
			}
		}
	})
}
