package proxy

import (
	"github.com/llmlb/llmlb/proxy/stream"
)

// maxJSONBody bounds the JSON answer llmlb holds until it parses and
// reads usage from; a longer answer is passed on as it comes, unchecked
// and uncounted.
// Holding costs one copy of the answer: the answer of a non-streamed
// request reaches the client whole, after its last byte, either way.
const maxJSONBody = 8 << 20

// usageReader is what an answer's reader tells of it once read: the usage
// the backend reported and the timing of its token events.
type usageReader interface {
	Usage() stream.Usage
}

// answerUsage is the usage of a JSON answer, read from it while it was
// held ([retryTransport.hold]).
type answerUsage stream.Usage

// Usage returns the usage the answer reported.
func (u answerUsage) Usage() stream.Usage { return stream.Usage(u) }

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
