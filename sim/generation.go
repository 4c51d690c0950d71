package sim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
}

// admit refuses a generation that does not fit the model's context, as
// vLLM does before queueing it, and numbers the others.
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
	return admitted{seq: seq, engine: engine, first: firstWord(g.continues, seq), prompt: prompt, job: Job{PromptTokens: prompt, MaxTokens: g.maxTokens,
		Adapter: g.adapter, Prompt: g.prompt, BytesPerToken: bpt, Seed: xxhash.Sum64String(g.model)}}, nil
}

// run generates a's tokens on the server's model, through the faults that
// show when it begins, calling token with each token's text in order; it
// returns the prompt tokens the prefix cache served. Its errors are
// [Model.Run]'s, errDie among them.
func (s *Server) run(ctx context.Context, a admitted, token func(text string) error) (cached int, err error) {
	n := 0
	return s.ranks[a.engine].Run(ctx, a.job, s.faultyEmit(ctx, func() error {
		t := word(a.first, n)
		n++
		return token(t)
	}))
}

// abortOnDie cuts the connection with no further answer when err is the
// die-mid-stream fault's, as a dying server's connection ends.
func abortOnDie(err error) {
	if errors.Is(err, errDie) {
		panic(http.ErrAbortHandler)
	}
}

// sseStream writes a server-sent event stream, flushing each event so it
// leaves at once, as the engines' streaming answers do.
type sseStream struct {
	w http.ResponseWriter
	f http.Flusher // nil when w cannot flush
}

// startSSE sends a stream's headers at once, before the first token: a
// real server's do (vLLM answers with Starlette's StreamingResponse, which
// sends http.response.start before iterating the body), and llmlb's
// first-byte timeout for streams reads them.
func startSSE(w http.ResponseWriter) *sseStream {
	f, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if f != nil {
		f.Flush()
	}
	return &sseStream{w: w, f: f}
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
	if e.f != nil {
		e.f.Flush()
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
