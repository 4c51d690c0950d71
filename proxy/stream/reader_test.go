package stream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// A Responses stream as vLLM sends it (vllm/entrypoints/openai/responses):
// typed events, usage in response.completed.
const responsesStream = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","usage":null}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":1,"delta":"Hel"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":2,"delta":"lo"}

event: response.completed
data: {"type":"response.completed","sequence_number":3,"response":{"id":"resp_1","status":"completed","usage":{"input_tokens":30,"input_tokens_details":{"cached_tokens":16},"output_tokens":2,"total_tokens":32}}}

`

// A Messages stream in Anthropic's shape, with Anthropic's cache counts
// (vLLM sends input_tokens alone).
const messagesStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","usage":{"input_tokens":5,"cache_read_input_tokens":20,"cache_creation_input_tokens":3,"output_tokens":0}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}

event: message_stop
data: {"type":"message_stop"}

`

// fakeClock ticks a millisecond per call.
func fakeClock() func() time.Time {
	t := time.Unix(0, 0)
	return func() time.Time { t = t.Add(time.Millisecond); return t }
}

func newTestReader(src io.Reader, api API, strip bool, onGap func(time.Duration)) *Reader {
	return NewReader(io.NopCloser(src), Options{API: api, Strip: strip, Now: fakeClock(), OnGap: onGap})
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReaderStripsInjectedUsage: the usage chunk llmlb asked for is read
// and taken out of the stream; everything else reaches the client as the
// backend sent it, however the reads are split.
func TestReaderStripsInjectedUsage(t *testing.T) {
	for _, split := range []bool{false, true} {
		var src io.Reader = strings.NewReader(vllmStream)
		if split {
			src = iotest.OneByteReader(src)
		}
		var gaps []time.Duration
		o := newTestReader(src, Completions, true, func(d time.Duration) { gaps = append(gaps, d) })
		got := readAll(t, o)
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
		if !o.Whole() {
			t.Error("a stream that ended with [DONE] is not whole")
		}
	}
}

// TestReaderPassesClientUsage: when the client asked for usage itself,
// the stream is unchanged, CRLF event ends included, and still read.
func TestReaderPassesClientUsage(t *testing.T) {
	crlf := strings.ReplaceAll(vllmStream, "\n", "\r\n")
	for _, in := range []string{vllmStream, crlf} {
		o := newTestReader(iotest.HalfReader(strings.NewReader(in)), Completions, false, nil)
		if got := readAll(t, o); got != in {
			t.Errorf("stream changed:\n%q\n%q", got, in)
		}
		if u := o.Usage(); !u.Known || u.Cached != 8 || u.TokenEvents != 2 {
			t.Errorf("usage %+v", u)
		}
	}
}

// TestReaderErrorsAndCuts: an error event is no token; a stream cut
// mid-event hands over the whole events and then the error.
func TestReaderErrorsAndCuts(t *testing.T) {
	in := "data: {\"error\":{\"message\":\"boom\"}}\n\ndata: {\"choices\":[{\"te"
	o := newTestReader(iotest.TimeoutReader(strings.NewReader(in)), Chat, true, nil)
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

// TestReaderKeepsDoneAfterStrippedUsage is issue 18's ninth problem: a
// backend that sends its usage chunk and [DONE] in one event (two data lines
// with no blank line between) lost the [DONE] with the usage chunk llmlb
// strips. Only the usage line goes; an event with other lines keeps them.
func TestReaderKeepsDoneAfterStrippedUsage(t *testing.T) {
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
				o := newTestReader(src, Completions, true, nil)
				if got := readAll(t, o); got != tc.want {
					t.Errorf("split %v: client got %q, want %q", split, got, tc.want)
				}
				if u := o.Usage(); !u.Known || u.Prompt != 3 || u.Completion != 1 || u.TokenEvents != 1 {
					t.Errorf("split %v: usage %+v", split, u)
				}
			}
		})
	}
}

// TestReaderSmallReads: the reader reads the backend into the caller's
// buffer, so a caller that reads a few bytes at a time (or asks for none)
// gets the same stream, usage chunk stripped, as one that reads it whole.
func TestReaderSmallReads(t *testing.T) {
	whole := readAll(t, newTestReader(strings.NewReader(vllmStream), Completions, true, nil))
	for _, size := range []int{1, 5, 64} {
		o := newTestReader(strings.NewReader(vllmStream), Completions, true, nil)
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

func TestReaderReadsResponsesAndMessagesUsage(t *testing.T) {
	for _, c := range []struct {
		name                              string
		api                               API
		body                              string
		prompt, completion, cached, token int
	}{
		{"responses stream", Responses, responsesStream, 30, 2, 16, 2},
		{"messages stream", Messages, messagesStream, 28, 2, 20, 2},
	} {
		for _, split := range []bool{false, true} {
			var src io.Reader = strings.NewReader(c.body)
			if split {
				src = iotest.OneByteReader(src)
			}
			o := newTestReader(src, c.api, false, nil)
			if got := readAll(t, o); got != c.body {
				t.Errorf("%s: the client got\n%s\nwant it unchanged", c.name, got)
			}
			u := o.Usage()
			if !u.Known || u.Prompt != c.prompt || u.Completion != c.completion || !u.CachedKnown || u.Cached != c.cached || u.TokenEvents != c.token {
				t.Errorf("%s (split %v): usage %+v; want prompt %d completion %d cached %d token events %d", c.name, split, u, c.prompt, c.completion, c.cached, c.token)
			}
		}
	}
	for _, c := range []struct {
		name                       string
		api                        API
		body                       string
		prompt, completion, cached int
	}{
		{"responses body", Responses, `{"id":"resp_1","object":"response","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":4}}`, 9, 4, 0},
		{"messages body, vLLM's usage", Messages, `{"id":"msg_1","type":"message","usage":{"input_tokens":12,"output_tokens":3}}`, 12, 3, -1},
		{"chat body", Chat, `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":3,"total_tokens":33,"prompt_tokens_details":null}}`, 30, 3, -1},
	} {
		u := BodyUsage(c.api, []byte(c.body))
		cached := -1
		if u.CachedKnown {
			cached = u.Cached
		}
		if !u.Known || u.Prompt != c.prompt || u.Completion != c.completion || cached != c.cached {
			t.Errorf("%s: usage %+v; want prompt %d completion %d cached %d", c.name, u, c.prompt, c.completion, c.cached)
		}
	}
	if BodyUsage(Chat, []byte(`{"oops"`)).Known {
		t.Error("usage from a broken body")
	}
}

// cutAt returns the stream of api cut before its k-th event from the end.
func cutAt(stream string, k int) string {
	evs := strings.SplitAfter(stream, "\n\n")
	evs = evs[:len(evs)-1] // "" after the last blank line
	return strings.Join(evs[:len(evs)-k], "")
}

// TestReaderWholeByProtocol: a stream is whole only when its API's
// terminator came, however the body ended. One that ended cleanly before
// it is a break: with nowhere to continue it, the client is sent an error
// event in its API's shape and the stream ends with ErrTruncated; one
// whose every token had arrived is ended whole for it where the API's
// terminator carries nothing llmlb lacks.
func TestReaderWholeByProtocol(t *testing.T) {
	chat := strings.ReplaceAll(vllmStream, `"text_completion"`, `"chat.completion.chunk"`)
	tests := []struct {
		name     string
		api      API
		in       string
		wantTail string // the end of what the client gets
		wantErr  error
		outcome  string // what became of the break, "" for none
	}{
		{"chat whole", Completions, chat, "data: [DONE]\n\n", nil, ""},
		{"chat before any finish", Completions, cutAt(vllmStream, 3), `"code":"stream_broken"}}` + "\n\n", ErrTruncated, OutcomeNotContinued},
		{"chat after its finish_reason", Completions, cutAt(vllmStream, 2), "data: [DONE]\n\n", nil, OutcomeCompleted},
		{"messages whole", Messages, messagesStream, "data: {\"type\":\"message_stop\"}\n\n", nil, ""},
		{"messages mid-block", Messages, cutAt(messagesStream, 4), "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"The model server's stream broke and it cannot be continued (api).\"}}\n\n", ErrTruncated, OutcomeNotContinued},
		{"messages after its stop_reason", Messages, cutAt(messagesStream, 1), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", nil, OutcomeCompleted},
		{"responses whole", Responses, responsesStream, `"total_tokens":32}}}` + "\n\n", nil, ""},
		{"responses before completed", Responses, cutAt(responsesStream, 1), `"param":null,"sequence_number":3}` + "\n\n", ErrTruncated, OutcomeNotContinued},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var outcome string
			r := NewReader(io.NopCloser(strings.NewReader(tc.in)), Options{API: tc.api, Now: fakeClock(),
				OnBreak: func(reason, o string, _ error) {
					if reason != BreakTruncated {
						t.Errorf("break reason %q, want %q", reason, BreakTruncated)
					}
					outcome = o
				}})
			got, err := io.ReadAll(r)
			if !errors.Is(err, tc.wantErr) && err != tc.wantErr {
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			if !strings.HasSuffix(string(got), tc.wantTail) {
				t.Errorf("the client got\n%s\nwant it to end with\n%s", got, tc.wantTail)
			}
			if outcome != tc.outcome {
				t.Errorf("outcome %q, want %q", outcome, tc.outcome)
			}
			if r.Whole() != (tc.wantErr == nil) {
				t.Errorf("Whole() = %v", r.Whole())
			}
		})
	}
}

// FuzzReader: a stream split at any points gives the client the same bytes
// and the same end as read whole; a completions stream that did not break
// passes unchanged; nothing panics.
func FuzzReader(f *testing.F) {
	f.Add([]byte(vllmStream), uint8(0), uint16(7), uint16(90))
	f.Add([]byte(strings.ReplaceAll(vllmStream, "\n", "\r\n")), uint8(0), uint16(1), uint16(2))
	f.Add([]byte(messagesStream), uint8(3), uint16(33), uint16(300))
	f.Add([]byte(responsesStream), uint8(2), uint16(5), uint16(50))
	f.Add([]byte("data: {\"usage\":{}}\n\n\n\ndata:\n\n"), uint8(1), uint16(3), uint16(4))
	f.Fuzz(func(t *testing.T, in []byte, api uint8, a, b uint16) {
		opt := func() Options {
			return Options{API: API(api % 4), Strip: api&4 != 0, Now: fakeClock(), OnGap: func(time.Duration) {}}
		}
		breaks := 0
		o := opt()
		o.OnBreak = func(string, string, error) { breaks++ }
		whole, werr := io.ReadAll(NewReader(io.NopCloser(bytes.NewReader(in)), o))
		lo, hi := min(int(a), len(in)), min(int(b), len(in))
		if lo > hi {
			lo, hi = hi, lo
		}
		split := io.MultiReader(bytes.NewReader(in[:lo]), bytes.NewReader(in[lo:hi]), iotest.OneByteReader(bytes.NewReader(in[hi:])))
		parts, perr := io.ReadAll(NewReader(io.NopCloser(split), opt()))
		if !bytes.Equal(whole, parts) || werr != perr {
			t.Fatalf("split at %d, %d:\n%q (%v)\nunsplit:\n%q (%v)", lo, hi, parts, perr, whole, werr)
		}
		if API(api%4) == Completions && api&4 == 0 && breaks == 0 && !bytes.Equal(whole, in) {
			t.Fatalf("a whole stream changed:\n%q\n%q", whole, in)
		}
	})
}

// FuzzParseChunk: what the one parse of a chunk reads of choices and usage
// is what encoding/json reads.
func FuzzParseChunk(f *testing.F) {
	f.Add([]byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}`))
	f.Add([]byte(`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2},"Choices":null}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1e3,"prompt_tokens_details":null}}`))
	f.Add([]byte(`{"choices":[{"text":"a\u00e9\n"},{"delta":{"content":"b"}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c chunk
		c.parse(Chat, data, nil)
		var j struct {
			Choices []struct {
				Text  *string `json:"text"`
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *wireUsage `json:"usage"`
		}
		if json.Unmarshal(data, &j) != nil {
			return // not an object encoding/json reads: no promise but no panic
		}
		if !c.obj {
			if bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) && data[0] == '{' {
				t.Fatalf("parse refused %q, which encoding/json reads", data)
			}
			return
		}
		var u *wireUsage
		if c.usage != nil && !scanUsage(c.usage, &u) {
			u = nil
			_ = json.Unmarshal(c.usage, &u)
		}
		if c.choices != len(j.Choices) || !reflect.DeepEqual(u, j.Usage) {
			t.Fatalf("parse(%q) = %d choices, usage %+v; encoding/json %d, %+v", data, c.choices, u, len(j.Choices), j.Usage)
		}
		var text strings.Builder
		for _, ch := range j.Choices {
			if ch.Text != nil {
				text.WriteString(*ch.Text)
			}
			if ch.Delta.Content != nil {
				text.WriteString(*ch.Delta.Content)
			}
		}
		if !c.odd && string(c.text) != text.String() {
			t.Fatalf("parse(%q) text %q, encoding/json %q", data, c.text, text.String())
		}
	})
}

// TestReaderServerErrorAfterFinishIsNotCompleted: a server's error event
// after the last token leaves the stream failed: llmlb does not end it
// with a [DONE] after the error.
func TestReaderServerErrorAfterFinishIsNotCompleted(t *testing.T) {
	in := cutAt(vllmStream, 2) + "data: {\"error\":{\"message\":\"boom\"}}\n\n"
	r := NewReader(io.NopCloser(strings.NewReader(in)), Options{API: Completions, Now: fakeClock()})
	got, err := io.ReadAll(r)
	if err == nil || strings.Contains(string(got), "[DONE]") || !strings.HasSuffix(string(got), "data: {\"error\":{\"message\":\"boom\"}}\n\n") {
		t.Errorf("the client got\n%s\n(%v); want the server's error event last and the stream failed", got, err)
	}
}

// noResume fails a test that continues a stream it should not.
type noResume struct{ t *testing.T }

func (n noResume) Resume(Rest) (io.ReadCloser, error) {
	n.t.Error("an evicted stream was continued")
	return nil, errors.New("no")
}

// judgedSource records what the reader told it of the stream's end.
type judgedSource struct {
	io.Reader
	ended []string
}

func (j *judgedSource) Ended(reason string) { j.ended = append(j.ended, reason) }
func (j *judgedSource) Close() error        { return nil }

// TestReaderEvictedStream: a stream llmlb evicted ends, whatever the
// source's read says, with an error event of code evicted in its API's
// shape and the read's cause, is never continued, reports no break, and
// tells its source it was evicted, not broken; the same cut not evicted
// is a break.
func TestReaderEvictedStream(t *testing.T) {
	cancelled := errors.New("context canceled")
	for _, tc := range []struct {
		name     string
		api      API
		in       string
		wantTail string
	}{
		{"chat", Chat, cutAt(vllmStream, 3), `{"error":{"message":"` + EvictedMessage + `","type":"rate_limit_error","param":null,"code":"evicted"}}` + "\n\n"},
		{"messages", Messages, cutAt(messagesStream, 4), `event: error` + "\n" + `data: {"type":"error","error":{"type":"rate_limit_error","message":"` + EvictedMessage + `"}}` + "\n\n"},
		{"responses", Responses, cutAt(responsesStream, 1), `{"type":"error","code":"evicted","message":"` + EvictedMessage + `","param":null,"sequence_number":3}` + "\n\n"},
	} {
		for _, evicted := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s evicted %v", tc.name, evicted), func(t *testing.T) {
				src := &judgedSource{Reader: io.MultiReader(strings.NewReader(tc.in), iotest.ErrReader(cancelled))}
				breaks := 0
				opt := Options{API: tc.api, Now: fakeClock(), Continuations: 2,
					Evicted: func() bool { return evicted },
					OnBreak: func(string, string, error) { breaks++ }}
				if evicted {
					opt.Resume = noResume{t}
				}
				got, err := io.ReadAll(NewReader(src, opt))
				if !errors.Is(err, cancelled) {
					t.Errorf("error %v, want the read's cause", err)
				}
				if evicted != strings.HasSuffix(string(got), tc.wantTail) {
					t.Errorf("the client got\n%s\nwant it to end with the eviction's event: %v", got, evicted)
				}
				if wantBreaks := map[bool]int{true: 0, false: 1}[evicted]; breaks != wantBreaks {
					t.Errorf("%d breaks reported, want %d", breaks, wantBreaks)
				}
				if want := map[bool]string{true: BreakEvicted, false: BreakCut}[evicted]; len(src.ended) != 1 || src.ended[0] != want {
					t.Errorf("source told %q, want %q", src.ended, want)
				}
			})
		}
	}
}
