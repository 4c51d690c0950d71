package sim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// This file is what the APIs share: a request, once read, becomes a
// [generation] that one path admits, runs on the model and streams, so
// completions, chat, the Responses API and the Messages API are priced and
// faulted alike and differ only in their wire formats.

// serves reports whether the server serves model, the base model or one
// of its adapters, and which adapter ("" for the base model).
func (s *Server) serves(model string) (adapter string, ok bool) {
	if model == s.cfg.Model {
		return "", true
	}
	if slices.Contains(s.cfg.Adapters, model) {
		return model, true
	}
	return "", false
}

// generation is one request to generate, read from whichever API carried
// it. The engine prices it from these fields alone, so completions, chat,
// the Responses API and the Messages API share one queue, prefix cache,
// prefill and decode model, one set of metrics and the same faults, and
// differ only in how they read a request and write the answer.
type generation struct {
	model     string // the name the client asked for: the base model or an adapter
	adapter   string // the LoRA adapter that serves it, or ""
	prompt    []byte // the prompt text as the engine tokenizes it
	ids       bool   // prompt is token ids, 4 bytes each
	continues string // the text the answer goes on from, or "" (see firstWord)
	maxTokens int    // tokens to generate, at least 1
	rank      string // the X-data-parallel-rank header, or ""
	stream    bool   // the answer streams, or runs apart from the request (a background response)
}

// rankHeader pins a request to a data-parallel rank; vLLM reads it as
// the global rank, and ignores a value that is not an integer
// (_get_data_parallel_rank in vllm/entrypoints/openai/engine/serving.py
// at 619e4b31). SGLang reads the same header, matched without regard to
// case, on its OpenAI routes (extract_routed_dp_rank_from_header in
// python/sglang/srt/entrypoints/openai/serving_base.py, sglang #19832),
// but refuses a value that is not an integer with a 400; the emulation
// ignores one for both flavours, as llmlb sends only integers.
const rankHeader = "X-data-parallel-rank"

// pickRank returns the index in s.ranks of the engine a request runs on:
// the rank its header names, else the one with the fewest requests
// waiting and running, ties taken in turn. A rank the server does not
// have is refused with 400, as vLLM's input processor refuses it
// (vllm/v1/engine/input_processor.py at a1799180: "data_parallel_rank
// %d is out of range [0, %d)."); the emulated server's range starts at
// its own first rank.
func (s *Server) pickRank(header string) (int, *refusal) {
	start := s.cfg.DataParallelStartRank
	if len(s.ranks) == 1 {
		start = 0
	}
	if r, err := strconv.Atoi(header); header != "" && err == nil {
		if r < start || r >= start+len(s.ranks) {
			return 0, badRequest("", fmt.Sprintf("data_parallel_rank %d is out of range [%d, %d).", r, start, start+len(s.ranks)))
		}
		return r - start, nil
	}
	if len(s.ranks) == 1 {
		return 0, nil
	}
	turn := int(s.spread.Add(1))
	best, bestLoad := 0, -1
	for k := range s.ranks {
		i := (turn + k) % len(s.ranks)
		st := s.ranks[i].Stats()
		if load := st.Waiting + st.Running; bestLoad < 0 || load < bestLoad {
			best, bestLoad = i, load
		}
	}
	return best, nil
}

// refusal is a request the server turns down, in no API's wire format
// yet: each API writes it in its own error shape.
type refusal struct {
	status int
	typ    string // vLLM's error type, such as "BadRequestError"
	param  string // the request field at fault, or ""
	msg    string
}

func badRequest(param, msg string) *refusal {
	return &refusal{status: http.StatusBadRequest, typ: "BadRequestError", param: param, msg: msg}
}

// writeVLLM writes rf in vLLM's error shape, which the OpenAI routes use.
func writeVLLM(w http.ResponseWriter, rf *refusal) {
	vllmError(w, rf.status, rf.typ, rf.param, rf.msg)
}

// lookupModel returns the adapter that serves model ("" for the base
// model), or the refusal for a model the server does not serve.
func (s *Server) lookupModel(model string) (string, *refusal) {
	adapter, ok := s.serves(model)
	if !ok {
		return "", &refusal{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
			msg: fmt.Sprintf("The model `%s` does not exist.", model)}
	}
	return adapter, nil
}

// promptTokens is the engines' token count for prompt text at 4 bytes a
// token.
func promptTokens(text []byte) int {
	return max(1, len(text)/BytesPerToken)
}

// bytesPerToken is the server's tokenizer's rate for text.
func (s *Server) bytesPerToken() int {
	if s.cfg.BytesPerToken > 0 {
		return s.cfg.BytesPerToken
	}
	return BytesPerToken
}

// admitted is a generation the server took on.
type admitted struct {
	seq    int64 // the server's request number
	engine int   // the index in Server.ranks of the engine that runs it
	first  int   // the vocabulary index of the answer's first word
	prompt int   // prompt tokens
	job    Job
	stream bool   // generation.stream
	die    *Fault // the die-mid-stream fault that takes the request, or nil
}

// admit refuses a generation that does not fit the model's context, as
// vLLM does before queueing it, and numbers the others; a die-mid-stream
// fault showing now takes those its share picks.
func (s *Server) admit(g generation) (admitted, *refusal) {
	bpt := s.bytesPerToken()
	if g.ids {
		bpt = BytesPerToken
	}
	prompt := max(1, len(g.prompt)/bpt)
	if prompt+g.maxTokens > s.cfg.MaxModelLen {
		return admitted{}, badRequest("", fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion).",
			s.cfg.MaxModelLen, prompt+g.maxTokens, prompt, g.maxTokens))
	}
	engine, rf := s.pickRank(g.rank)
	if rf != nil {
		return admitted{}, rf
	}
	seq := s.seq.Add(1)
	a := admitted{seq: seq, engine: engine, first: firstWord(g.continues, seq), prompt: prompt, job: Job{PromptTokens: prompt, MaxTokens: g.maxTokens,
		Adapter: g.adapter, Prompt: g.prompt, BytesPerToken: bpt, Seed: xxhash.Sum64String(g.model)}, stream: g.stream}
	if f, ok := s.fault(FaultDieMidStream); ok && f.takes(seq) {
		a.die = &f
	}
	return a, nil
}

// run generates a's tokens on the server's model, through the faults that
// show when it begins, calling token with each token's text in order; it
// returns the prompt tokens the prefix cache served. Its errors are
// [Model.Run]'s, errDie among them.
func (s *Server) run(ctx context.Context, a admitted, token func(text string) error) (cached int, err error) {
	n := 0
	return s.ranks[a.engine].Run(ctx, a.job, s.faultyEmit(ctx, a, func() error {
		t := word(a.first, n)
		n++
		return token(t)
	}))
}

// abortOnDie cuts the connection of a non-streamed request with no answer
// when err is the die-mid-stream fault's, as a dying server's connection
// ends. (Only cut stops a non-streamed generation; see [writeAnswer].)
func abortOnDie(err error) {
	if errors.Is(err, errDie) {
		panic(http.ErrAbortHandler)
	}
}

// writeAnswer answers 200 with a's non-streamed answer v as JSON, as
// writeJSON does, unless the die-mid-stream fault took a with the clean or
// close framing. Then, if the answer has more than the fault's Events
// tokens, only the first half of the JSON's bytes goes out; with a
// Content-Length of what goes out (clean), or delimited by the
// connection, which is then closed (close; over HTTP/2, which cannot, the
// connection is cut with no answer).
func writeAnswer(w http.ResponseWriter, a admitted, v any) {
	die := a.die
	if die == nil || die.framing() == FramingCut {
		writeJSON(w, v)
		return
	}
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(v) // the bytes writeJSON writes
	b := buf.Bytes()
	if a.job.MaxTokens > die.Events {
		b = b[:len(b)/2]
	}
	w.Header().Set("Content-Type", "application/json")
	if die.framing() == FramingClose {
		conn, bw := hijackRaw(w)
		if conn == nil {
			panic(http.ErrAbortHandler)
		}
		defer conn.Close()
		_, _ = bw.Write(b)
		_ = bw.Flush()
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// sseStream writes a server-sent event stream, flushing each event so it
// leaves at once, as the engines' streaming answers do.
type sseStream struct {
	w     io.Writer
	flush func() error // nil when w cannot flush
	// conn is the connection that delimits the stream (die-mid-stream's
	// close framing), which close closes; nil for a chunked stream.
	conn net.Conn
	// framing is that of the die-mid-stream fault that took the stream;
	// "" when none did.
	framing Framing
}

// startSSE sends a stream's headers at once, before the first token: a
// real server's do (vLLM answers with Starlette's StreamingResponse, which
// sends http.response.start before iterating the body), and llmlb's
// first-byte timeout for streams reads them. die is the die-mid-stream
// fault that took the stream, or nil; under its close framing the stream
// is delimited by the connection, and the caller must call
// [sseStream.close] when done.
func startSSE(w http.ResponseWriter, die *Fault) *sseStream {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	var framing Framing
	if die != nil {
		framing = die.framing()
	}
	if framing == FramingClose {
		if conn, bw := hijackRaw(w); conn != nil {
			e := &sseStream{w: bw, flush: bw.Flush, conn: conn, framing: framing}
			_ = e.flush()
			return e
		}
	}
	e := &sseStream{w: w, framing: framing}
	if f, ok := w.(http.Flusher); ok {
		e.flush = func() error { f.Flush(); return nil }
	}
	w.WriteHeader(http.StatusOK)
	if e.flush != nil {
		_ = e.flush()
	}
	return e
}

// abortOnDie ends the stream when err is the die-mid-stream fault's, as
// its framing says: cut (and close where the connection could not be
// taken over) aborts the handler, so the chunked body ends without its
// last chunk; clean and close return, and so does the caller, which ends
// the chunked body with its last chunk (clean) or closes the connection
// (close, by [sseStream.close]).
func (e *sseStream) abortOnDie(err error) {
	if errors.Is(err, errDie) && e.framing != FramingClean && e.conn == nil {
		panic(http.ErrAbortHandler)
	}
}

// close ends a stream delimited by its connection by closing it; it does
// nothing to a chunked stream, which the handler's return ends.
func (e *sseStream) close() {
	if e.conn != nil {
		_ = e.flush()
		_ = e.conn.Close()
	}
}

// send writes v as one event; see [sseFrame].
func (e *sseStream) send(name string, v any) error {
	b, err := sseFrame(name, v)
	if err != nil {
		return err
	}
	return e.write(b)
}

// write writes frames as they are and flushes them.
func (e *sseStream) write(frames []byte) error {
	if _, err := e.w.Write(frames); err != nil {
		return err
	}
	if e.flush != nil {
		return e.flush()
	}
	return nil
}

// sseFrame encodes one event: an "event: {name}" line when name is not
// empty (the Responses and Messages APIs name their events, chat's are
// unnamed), then v as JSON on one data line, then the blank line.
func sseFrame(name string, v any) ([]byte, error) {
	var buf bytes.Buffer
	if name != "" {
		buf.WriteString("event: " + name + "\n")
	}
	buf.WriteString("data: ")
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		return nil, err
	}
	buf.Truncate(buf.Len() - 1) // Encode's newline
	buf.WriteString("\n\n")
	return buf.Bytes(), nil
}

// defaultChatMaxTokens is the emulation's output length for a chat or
// Responses request that sets none. (vLLM's default, what the context
// leaves, would make every such request run for minutes.)
const defaultChatMaxTokens = 64

// randomID returns prefix and 32 lowercase hex digits, a random UUID as
// vLLM's random_uuid() writes it (the ids of responses and their items).
func randomID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])  // crypto/rand.Read does not fail
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	return prefix + hex.EncodeToString(b[:])
}

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

var words = strings.Fields("the quick brown fox jumps over a lazy dog while seven bright stars shine on quiet hills and rivers run")

// word returns the n-th output token of an answer that starts with
// words[first]: the vocabulary in a cycle, one word a token.
func word(first, n int) string {
	return " " + words[(first+n)%len(words)]
}

// firstWord returns the vocabulary index an answer starts at. An answer
// that goes on from text ending in one of the vocabulary's words, as the
// answers end (" fox"), starts at the word after it: a chat that continues
// the delivered part of a cut answer, or a completion whose prompt ends
// with it, gets the rest of what the unbroken answer would have said, on
// any server, as a model at temperature 0 would. Any other answer starts
// at the server's request number, so answers differ.
func firstWord(continues string, seq int64) int {
	if i := strings.LastIndexByte(continues, ' '); i >= 0 {
		if k := slices.Index(words, continues[i+1:]); k >= 0 {
			return k + 1
		}
	}
	return int(seq % int64(len(words)))
}
