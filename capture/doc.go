// Package capture writes a sample of the requests llmlb serves as a trace
// in the Mooncake format (one JSON line a request: arrival in ms, input and
// output tokens, one id per block of the prompt's tokens, 128 unless set), with what
// routing needs beside it (model, API, priority, session and conversation
// keys, the tokens the server reported, the backend, TTFT), so that the
// bench can replay an operator's own traffic.
//
// A capture never holds prompt text. Block ids are chained hashes of the
// prompt's canonical bytes ([prefix.Parts]) passed through a keyed
// pseudo-random function of the capture's salt, so equal ids still mean an
// equal prefix, while nobody without the salt can tell which text an id
// stands for. Writing never blocks a request: lines go into a bounded
// buffer that one goroutine drains to the file; a full buffer drops the
// line and counts it.
package capture
