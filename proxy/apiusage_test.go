package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

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

func TestObserverReadsResponsesAndMessagesUsage(t *testing.T) {
	for _, c := range []struct {
		name                              string
		kind                              Kind
		sse                               bool
		body                              string
		prompt, completion, cached, token int
	}{
		{"responses stream", KindResponses, true, responsesStream, 30, 2, 16, 2},
		{"messages stream", KindMessages, true, messagesStream, 28, 2, 20, 2},
		{"responses body", KindResponses, false, `{"id":"resp_1","object":"response","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":4}}`, 9, 4, 0, 0},
		{"messages body, vLLM's usage", KindMessages, false, `{"id":"msg_1","type":"message","usage":{"input_tokens":12,"output_tokens":3}}`, 12, 3, -1, 0},
	} {
		for _, split := range []bool{false, true} {
			var src io.Reader = strings.NewReader(c.body)
			if split {
				src = iotest.OneByteReader(src)
			}
			o := newObserver(io.NopCloser(src), c.kind, c.sse, false, fakeClock(), nil)
			if got := readObserved(t, o); got != c.body {
				t.Errorf("%s: the client got\n%s\nwant it unchanged", c.name, got)
			}
			u := o.Usage()
			cached := -1
			if u.CachedKnown {
				cached = u.Cached
			}
			if !u.Known || u.Prompt != c.prompt || u.Completion != c.completion || cached != c.cached || u.TokenEvents != c.token {
				t.Errorf("%s (split %v): usage %+v; want prompt %d completion %d cached %d token events %d", c.name, split, u, c.prompt, c.completion, c.cached, c.token)
			}
		}
	}
}

func TestClientKey(t *testing.T) {
	for _, c := range []struct {
		h    http.Header
		want string
		err  error
	}{
		{http.Header{"Authorization": {"Bearer k1"}}, "k1", nil},
		{http.Header{"X-Api-Key": {"k1"}}, "k1", nil},
		{http.Header{"X-Api-Key": {"k1"}, "Authorization": {"Bearer k1"}}, "k1", nil},
		{http.Header{"X-Api-Key": {"k1"}, "Authorization": {"Bearer k2"}}, "", errKeyInvalid},
		{http.Header{"X-Api-Key": {"k1", "k2"}}, "", errKeyInvalid},
		{http.Header{"X-Api-Key": {"k 1"}}, "", errKeyInvalid},
		{http.Header{"X-Api-Key": {""}}, "", errKeyInvalid},
		{http.Header{}, "", errKeyMissing},
	} {
		got, err := clientKey(c.h)
		if got != c.want || err != c.err {
			t.Errorf("%v: %q, %v; want %q, %v", c.h, got, err, c.want, c.err)
		}
	}
}
