package proxy

import (
	"io"

	"github.com/llmlb/llmlb/proxy/stream"
)

// maxJSONBody bounds the JSON answer llmlb holds until it parses and
// reads usage from; a longer answer is passed on as it comes, unchecked.
// Holding costs one copy of the answer: the answer of a non-streamed
// request reaches the client whole, after its last byte, either way.
const maxJSONBody = 8 << 20

// usageReader is what an answer's reader tells of it once read: the usage
// the backend reported and the timing of its token events.
type usageReader interface {
	Usage() stream.Usage
}

// jsonObserver reads the usage of a JSON answer as it passes to the
// client, at its end.
type jsonObserver struct {
	src  io.ReadCloser
	api  stream.API
	body []byte // the answer so far; nil once over maxJSONBody
	over bool
	u    stream.Usage
}

func newJSONObserver(src io.ReadCloser, api stream.API) *jsonObserver {
	return &jsonObserver{src: src, api: api}
}

// Usage returns the usage the answer reported; known once it was read.
func (o *jsonObserver) Usage() stream.Usage { return o.u }

func (o *jsonObserver) Read(p []byte) (int, error) {
	n, err := o.src.Read(p)
	if !o.over {
		if len(o.body)+n > maxJSONBody {
			o.over, o.body = true, nil
		} else {
			o.body = append(o.body, p[:n]...)
		}
	}
	if err == io.EOF && !o.over {
		o.u = stream.BodyUsage(o.api, o.body)
		o.body = nil
	}
	return n, err
}

func (o *jsonObserver) Close() error { return o.src.Close() }

// streamAPI is the stream package's name of a generating API.
func streamAPI(k Kind) stream.API {
	switch k {
	case KindChat:
		return stream.Chat
	case KindResponses:
		return stream.Responses
	case KindMessages:
		return stream.Messages
	}
	return stream.Completions
}
