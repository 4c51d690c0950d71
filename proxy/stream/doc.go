// Package stream is the path of a streamed answer from a model server to
// the client. One [Reader] per answer splits the server's server-sent
// events once, parses each event once, and runs the stages over it in the
// order [Reader.event] writes: whether the stream is whole, continuation
// bookkeeping, usage and inter-token timing, the usage strip, the model
// name and response id rewrite.
//
// A stream is whole when its API's terminator reached the client, and
// only then:
//   - OpenAI completions and chat: `data: [DONE]`, which vLLM, SGLang and
//     trtllm-serve send last;
//   - Anthropic Messages: the message_stop event;
//   - OpenAI Responses: response.completed, response.incomplete or
//     response.failed.
//
// A stream that ends any other way broke, however the connection ended:
// cut, shut on a connection-delimited body, a chunked body ended cleanly,
// silent past its idle limit, or an error event. A break is continued on
// another server when the API and the request allow it (see [Resumer]);
// otherwise the client is sent an error event in its API's shape and the
// stream is ended as failed, so that no client takes a truncated answer
// for a short one.
//
// JSON answers do not come here: they are whole when their JSON is, and
// the proxy holds them until it parses.
package stream
