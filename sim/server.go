package sim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ServerConfig describes one emulated model server.
type ServerConfig struct {
	// Engine is the flavour the server imitates. (default "vllm")
	Engine string
	// Model is the base model name served. Required.
	Model string
	// Adapters are LoRA adapter names served on top of Model.
	Adapters []string
	// MaxModelLen is the context length reported by /v1/models and enforced
	// on prompts. (default 131072)
	MaxModelLen int
	// MaxStoredResponses is how many Responses API responses the server
	// keeps, the newest, for GET, input_items, cancel and
	// previous_response_id. A negative number keeps none, as vLLM without
	// VLLM_ENABLE_RESPONSES_API_STORE=1: store=true is then ignored and
	// background refused. (default 10000)
	MaxStoredResponses int
	// DataParallelStartRank is the global rank of the server's first
	// data-parallel rank (vllm serve --data-parallel-start-rank); a
	// server of one rank ignores it. See [NewDataParallelServer].
	// (default 0)
	DataParallelStartRank int
	// PD makes the server one side of a disaggregated prefill/decode
	// pair (pd.go); zero is an aggregated server.
	PD PDConfig
	// BytesPerToken is how many bytes of prompt text the server's
	// tokenizer reads a token, for an emulated model whose tokenizer is
	// not llmlb's 4; a prompt of token ids counts one token an id
	// whatever it is. KV-cache events name tokens of 4 bytes, so they
	// need 4. (default 4)
	BytesPerToken int
}

// Server is an emulated model server. Its handler may be called
// concurrently.
type Server struct {
	cfg     ServerConfig
	ranks   []Model // one engine per data-parallel rank, from DataParallelStartRank
	spread  atomic.Uint64
	created int64
	seq     atomic.Int64 // request ids
	// responses is the Responses API store; nil when the server keeps
	// none.
	responses *responseStore

	faults        atomic.Pointer[faultState] // nil: no fault
	fmu           sync.Mutex
	faultsChanged chan struct{} // guarded by fmu; closed by SetFaults
}

// NewServer returns an emulated server that runs requests on m.
func NewServer(cfg ServerConfig, m Model) (*Server, error) {
	return NewDataParallelServer(cfg, []Model{m})
}

// NewDataParallelServer returns an emulated server that runs several
// engines behind one port, as vllm serve --data-parallel-size
// len(ranks) or sglang's --dp-size does: ranks[i] is global rank
// DataParallelStartRank+i, with its own queue and KV cache, and its
// metrics are labelled as the flavour labels a rank (see
// [RenderRankMetrics]). A request with X-data-parallel-rank runs on that
// rank, the header both engines read; one without is spread by the
// server itself, to the rank with the fewest requests (vLLM's DP
// coordinator balances on its engines' queues), ties in turn. Only the
// vllm and sglang flavours serve more than one rank: the TensorRT-LLM
// pages have no rank label to emulate.
func NewDataParallelServer(cfg ServerConfig, ranks []Model) (*Server, error) {
	if err := checkEngine(cfg.Engine); err != nil {
		return nil, err
	}
	if len(ranks) == 0 {
		return nil, fmt.Errorf("sim: a server needs at least one engine")
	}
	if len(ranks) > 1 && cfg.Engine != "" && cfg.Engine != "vllm" && cfg.Engine != "sglang" {
		return nil, fmt.Errorf("sim: data-parallel ranks are emulated for vllm and sglang only, not %s", cfg.Engine)
	}
	if cfg.DataParallelStartRank < 0 {
		return nil, fmt.Errorf("sim: data-parallel start rank must not be negative, got %d", cfg.DataParallelStartRank)
	}
	m := ranks[0]
	if cfg.Model == "" {
		return nil, fmt.Errorf("sim: a model name is required")
	}
	if err := checkRole(cfg.PD.Role); err != nil {
		return nil, err
	}
	cfg.PD.setDefaults()
	if cfg.Engine == "" {
		cfg.Engine = "vllm"
	}
	if cfg.MaxModelLen <= 0 {
		cfg.MaxModelLen = 131072
	}
	if c, ok := m.(interface{ Capacity() int }); ok {
		// vLLM refuses to start with a max_model_len its KV cache cannot
		// hold; the emulation shrinks it instead.
		cfg.MaxModelLen = min(cfg.MaxModelLen, c.Capacity())
	}
	s := &Server{cfg: cfg, ranks: ranks, created: time.Now().Unix(), faultsChanged: make(chan struct{})}
	switch {
	case cfg.MaxStoredResponses == 0:
		s.responses = newResponseStore(defaultMaxStoredResponses)
	case cfg.MaxStoredResponses > 0:
		s.responses = newResponseStore(cfg.MaxStoredResponses)
	}
	return s, nil
}

// Handler returns the server's routes, and /sim/faults, the switch for
// the faults it shows (see [Server.SetFaults]). Every flavour serves the
// OpenAI completions, chat and Responses APIs and Anthropic's Messages API
// (responses.go, messages.go), priced alike.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.disaggregated(func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) }))
	mux.HandleFunc("POST /v1/chat/completions", s.disaggregated(func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) }))
	mux.HandleFunc("POST /v1/responses", s.createResponse)
	mux.HandleFunc("GET /v1/responses/{id}", s.getResponse)
	mux.HandleFunc("DELETE /v1/responses/{id}", s.deleteResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", s.cancelResponse)
	mux.HandleFunc("GET /v1/responses/{id}/input_items", s.listInputItems)
	mux.HandleFunc("POST /v1/messages", s.createMessage)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.countMessageTokens)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", s.healthy)
	mux.HandleFunc("/sim/faults", s.serveFaults)
	switch s.cfg.Engine {
	case "trtllm-serve":
		// Prometheus text lives at /prometheus/metrics; /metrics is JSON.
		mux.HandleFunc("GET /prometheus/metrics", s.metrics)
		mux.HandleFunc("GET /metrics", s.iterationStats)
	case "triton-tensorrt-llm":
		mux.HandleFunc("GET /metrics", s.metrics)
		mux.HandleFunc("GET /v2/health/ready", s.healthy)
	default:
		mux.HandleFunc("GET /metrics", s.metrics)
		mux.HandleFunc("POST /tokenize", s.tokenize)
	}
	return s.withConnFaults(mux)
}

// tokenize answers vLLM's POST /tokenize (vllm/entrypoints/openai
// serving_tokenization.py): a completion's prompt or a chat's messages,
// rendered as generate renders them, add_generation_prompt and
// continue_final_message included (vLLM's TokenizeChatRequest takes both,
// vllm/entrypoints/serve/tokenize/protocol.py at 343bacaf), to {"count",
// "max_model_len", "tokens"}.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var g genRequest
	if err := json.NewDecoder(r.Body).Decode(&g); err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "", "Invalid request body: "+err.Error())
		return
	}
	if rf := g.validate(g.Messages != nil); rf != nil {
		writeVLLM(w, rf)
		return
	}
	if _, ok := s.serves(g.Model); !ok {
		vllmError(w, http.StatusNotFound, "NotFoundError", "model", fmt.Sprintf("The model `%s` does not exist.", g.Model))
		return
	}
	text, _, err := g.promptText(g.Messages != nil)
	if err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "", err.Error())
		return
	}
	tokens := Tokens(text)
	if bpt := s.bytesPerToken(); bpt != BytesPerToken && !(g.Messages == nil && g.idsPrompt()) {
		tokens = tokensAt(text, bpt)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(tokens), "max_model_len": s.cfg.MaxModelLen, "tokens": tokens, "token_strs": nil})
}

// vllmError writes vLLM's error shape,
// {"error":{"message":...,"type":...,"param":...,"code":<int>}}, its fields
// in vLLM's order so a body can be compared byte for byte.
func vllmError(w http.ResponseWriter, code int, typ, param, msg string) {
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	body.Error.Message, body.Error.Type, body.Error.Code = msg, typ, code
	if param != "" {
		body.Error.Param = &param
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

type genRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// AddGenerationPrompt and ContinueFinalMessage choose how a chat's
	// prompt ends ([chatEnd]); nil AddGenerationPrompt is vLLM's default,
	// true. A completion ignores both, as vLLM's CompletionRequest has
	// neither.
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
}

// validate refuses a chat that sets both add_generation_prompt and
// continue_final_message to true, as vLLM's request model does before the
// request reaches a handler (ChatCompletionRequest.check_generation_prompt
// in vllm/entrypoints/openai/chat_completion/protocol.py at d5dba2d7, and
// TokenizeChatRequest's alike), so in FastAPI's validation error shape:
// type "Bad Request", no param. vLLM's message is FastAPI's dump of the
// error, which quotes the request body; the emulation sends the
// validator's message alone, as pydantic words it.
func (g *genRequest) validate(chat bool) *refusal {
	if chat && g.ContinueFinalMessage && g.AddGenerationPrompt != nil && *g.AddGenerationPrompt {
		return &refusal{status: http.StatusBadRequest, typ: "Bad Request",
			msg: "Value error, Cannot set both `continue_final_message` and `add_generation_prompt` to True."}
	}
	return nil
}

// chatEnd reads how the chat's prompt ends, refusing what vLLM's template
// stage refuses. continue_final_message with add_generation_prompt at its
// default, true, reaches transformers' apply_chat_template, whose check
// words the refusal (src/transformers/tokenization_utils_base.py at
// 598a3dc3; both set true explicitly is refused earlier, by
// [genRequest.validate]). continue_final_message after a last message that
// is not the assistant's is refused in the words of vLLM's Rust front end
// (rust/src/chat/src/error.rs at 030ea52e, raised by ChatRequest.validate);
// vLLM's Python server lets it through and leaves the user's message open,
// but refusing catches a caller that continues the wrong message.
func (g *genRequest) chatEnd(turns []turn) (chatEnd, error) {
	switch {
	case g.ContinueFinalMessage && (g.AddGenerationPrompt == nil || *g.AddGenerationPrompt):
		//lint:ignore ST1005 vLLM's own message, word for word
		return 0, errors.New("continue_final_message and add_generation_prompt are not compatible. " +
			"Use continue_final_message when you want the model to continue the final message, " +
			"and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead.")
	case g.ContinueFinalMessage && turns[len(turns)-1].role != "assistant":
		return 0, errors.New("cannot continue the final message when the last message is not from the assistant")
	case g.ContinueFinalMessage:
		return continueFinal, nil
	case g.AddGenerationPrompt != nil && !*g.AddGenerationPrompt:
		return closedTurns, nil
	}
	return newTurn, nil
}

type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// promptText renders the prompt as the engine would see it before
// tokenizing: a completion prompt as sent (token ids as four bytes each),
// chat messages through the emulation's chat template ([renderTemplate]),
// ended as [genRequest.chatEnd] says. [BytesPerToken] bytes of it count as
// one token, and its full blocks are hashed for the prefix cache, so
// requests that share leading messages share cached blocks. It also
// returns the text the answer continues (see [firstWord]): a chat's final
// message when the answer continues it, a completion's prompt (a model
// continues its prompt), or "" for a new turn.
func (g *genRequest) promptText(chat bool) (text []byte, continues string, err error) {
	if chat {
		turns, err := chatTurns(g.Messages)
		if err != nil {
			return nil, "", err
		}
		end, err := g.chatEnd(turns)
		if err != nil {
			return nil, "", err
		}
		if end == continueFinal {
			continues = turns[len(turns)-1].text
		}
		return renderTemplate(turns, end), continues, nil
	}
	text, err = g.completionPrompt()
	return text, string(text), err
}

// completionPrompt renders a completion's prompt; see
// [genRequest.promptText].
// idsPrompt reports whether a completion's prompt is a list of token ids.
func (g *genRequest) idsPrompt() bool {
	var ids []int
	return json.Unmarshal(g.Prompt, &ids) == nil && len(ids) > 0
}

func (g *genRequest) completionPrompt() ([]byte, error) {
	var s string
	if json.Unmarshal(g.Prompt, &s) == nil {
		if s == "" {
			return nil, fmt.Errorf("prompt must not be empty")
		}
		return []byte(s), nil
	}
	var b []byte
	var ids []int
	if json.Unmarshal(g.Prompt, &ids) == nil && len(ids) > 0 {
		for _, id := range ids {
			b = binary.LittleEndian.AppendUint32(b, uint32(id))
		}
		return b, nil
	}
	var strs []string
	if json.Unmarshal(g.Prompt, &strs) == nil && len(strs) > 0 {
		for _, s := range strs {
			b = append(b, s...)
		}
		return b, nil
	}
	return nil, fmt.Errorf("prompt must be a non-empty string, list of strings or list of token ids")
}

// generate serves completions (chat false) and chat completions.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	var g genRequest
	if err := json.NewDecoder(r.Body).Decode(&g); err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "", "Invalid request body: "+err.Error())
		return
	}
	if rf := g.validate(chat); rf != nil {
		writeVLLM(w, rf)
		return
	}
	if s.generationFault(w, r, writeVLLM) {
		return
	}
	adapter, rf := s.lookupModel(g.Model)
	if rf != nil {
		writeVLLM(w, rf)
		return
	}
	text, continues, err := g.promptText(chat)
	if err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "", err.Error())
		return
	}
	maxTokens := 16 // vLLM's completions default
	if chat {
		maxTokens = defaultChatMaxTokens
	}
	switch {
	case g.MaxCompletionTokens != nil:
		maxTokens = *g.MaxCompletionTokens
	case g.MaxTokens != nil:
		maxTokens = *g.MaxTokens
	}
	if maxTokens < 1 {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "max_tokens", "max_tokens must be at least 1, got "+strconv.Itoa(maxTokens)+".")
		return
	}
	a, rf := s.admit(generation{model: g.Model, adapter: adapter, prompt: text, ids: !chat && g.idsPrompt(), continues: continues, maxTokens: maxTokens,
		rank: r.Header.Get(rankHeader), stream: g.Stream})
	if rf != nil {
		writeVLLM(w, rf)
		return
	}

	idPrefix, object, chunkObject := "cmpl-", "text_completion", "text_completion"
	if chat {
		idPrefix, object, chunkObject = "chatcmpl-", "chat.completion", "chat.completion.chunk"
	}
	rid := fmt.Sprintf("%s%x%08x", idPrefix, s.created, a.seq)
	usage := func(cached int) map[string]any {
		return map[string]any{"prompt_tokens": a.prompt, "completion_tokens": maxTokens, "total_tokens": a.prompt + maxTokens,
			"prompt_tokens_details": map[string]any{"cached_tokens": cached}}
	}

	if !g.Stream {
		var text strings.Builder
		cached, err := s.run(r.Context(), a, func(t string) error { text.WriteString(t); return nil })
		abortOnDie(err) // the connection closes with no answer
		if err != nil {
			return // the client left; vLLM aborts the request the same way
		}
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": "length", "stop_reason": nil}
		if chat {
			choice["message"] = map[string]any{"role": "assistant", "content": text.String(), "tool_calls": []any{}}
		} else {
			choice["text"] = text.String()
		}
		writeAnswer(w, a, map[string]any{
			"id": rid, "object": object, "created": time.Now().Unix(), "model": g.Model,
			"choices": []any{choice}, "usage": usage(cached),
		})
		return
	}

	includeUsage := g.StreamOptions != nil && g.StreamOptions.IncludeUsage
	sse := startSSE(w, a.die)
	defer sse.close()
	chunk := func(choices []any) map[string]any {
		c := map[string]any{"id": rid, "object": chunkObject, "created": time.Now().Unix(), "model": g.Model, "choices": choices}
		if includeUsage {
			c["usage"] = nil
		}
		return c
	}
	n := 0
	cached, err := s.run(r.Context(), a, func(t string) error {
		var finish any
		if n == maxTokens-1 {
			finish = "length"
		}
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish, "stop_reason": nil}
		if chat {
			if n == 0 {
				// vLLM opens a chat stream with the role alone.
				first := map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}
				if err := sse.send("", chunk([]any{first})); err != nil {
					return err
				}
			}
			choice["delta"] = map[string]any{"content": t}
		} else {
			choice["text"] = t
		}
		n++
		return sse.send("", chunk([]any{choice}))
	})
	sse.abortOnDie(err) // end the stream early: no final chunk, no [DONE]
	if err != nil {
		return
	}
	if includeUsage {
		c := chunk([]any{})
		c["usage"] = usage(cached)
		if sse.send("", c) != nil {
			return
		}
	}
	_ = sse.write([]byte("data: [DONE]\n\n"))
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	card := func(id, root string, parent any) map[string]any {
		c := map[string]any{
			"id": id, "object": "model", "created": s.created, "owned_by": "vllm",
			"root": root, "parent": parent, "permission": []any{},
		}
		if parent == nil {
			c["max_model_len"] = s.cfg.MaxModelLen
		}
		return c
	}
	data := []any{card(s.cfg.Model, s.cfg.Model, nil)}
	for _, a := range s.cfg.Adapters {
		data = append(data, card(a, "/adapters/"+a, s.cfg.Model))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// metrics serves the engine's Prometheus page for the model's state.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	page := func() string {
		if len(s.ranks) > 1 {
			sts := make([]Stats, len(s.ranks))
			for i, m := range s.ranks {
				sts[i] = m.Stats()
			}
			return RenderRankMetrics(s.cfg.Engine, s.cfg.Model, len(s.cfg.Adapters) > 0, s.cfg.DataParallelStartRank, sts, time.Now())
		}
		return RenderMetrics(s.cfg.Engine, s.cfg.Model, len(s.cfg.Adapters) > 0, s.ranks[0].Stats(), time.Now())
	}
	if s.metricsFault(w, r, page) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(page()))
}

// iterationStats answers trtllm-serve's JSON /metrics: a list of iteration
// statistics, the newest last.
func (s *Server) iterationStats(w http.ResponseWriter, r *http.Request) {
	st := s.ranks[0].Stats() // trtllm-serve: one rank
	used := int(st.KVUsage * float64(st.NumBlocks))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode([]map[string]any{{
		"iter":              s.seq.Load(),
		"numActiveRequests": st.Running,
		"numQueuedRequests": st.Waiting,
		"kvCacheStats": map[string]any{
			"maxNumBlocks": st.NumBlocks, "usedNumBlocks": used, "freeNumBlocks": st.NumBlocks - used, "tokensPerBlock": st.BlockSize,
		},
	}})
}

// formatFloat prints v as Python's prometheus_client does: always with a
// decimal point or exponent.
func formatFloat(v float64) string {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eE") && !strings.Contains(s, "Inf") && !strings.Contains(s, "NaN") {
		s += ".0"
	}
	return s
}
