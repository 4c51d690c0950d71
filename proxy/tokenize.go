package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/kvevents"
)

// tokenizer turns a prompt into the token blocks the backends' KV-cache
// events name, for a balancer that reads them: it asks one backend serving
// the model for POST /tokenize (vLLM's: a completion's prompt, or a chat's
// messages rendered by the model's chat template, with the request's tools
// and template arguments), so the tokens are the engine's own whatever
// the model, tokenizer or template. A completion sends its model and
// prompt alone; a chat its whole body, whose fields the tokenizer does not
// use vLLM accepts (vllm/entrypoints/openai: OpenAIBaseModel allows extra
// fields and logs them).
type tokenizer struct {
	store  *kvevents.Store
	client *http.Client
	next   atomic.Uint64 // rotates the backends asked
	// tok pauses /tokenize, render the render endpoints, which a server
	// may lack while it has /tokenize.
	tok, render pause
}

// pause stops asking servers to tokenize after a failure, until its
// until (unix nanoseconds): a fleet whose servers cannot tokenize (no
// such route, overloaded) would otherwise cost every request a round trip
// or a whole proxy.tokenize_timeout. It doubles with each failure in a
// row, from 1s to 30s.
type pause struct {
	until    atomic.Int64
	failures atomic.Int64 // in a row
}

// backend returns the next of snap's ready backends serving model in turn,
// nil if there is none; it allocates nothing.
func (t *tokenizer) backend(snap *balancer.Snapshot, model string) *balancer.Backend {
	ready := func(be *balancer.Backend) bool { return be.State == balancer.StateReady && be.Serves(model) }
	n := 0
	for _, be := range snap.Backends {
		if ready(be) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	k := int(t.next.Add(1) % uint64(n))
	for _, be := range snap.Backends {
		if ready(be) {
			if k == 0 {
				return be
			}
			k--
		}
	}
	return nil
}

// failed records a failure and pauses.
func (p *pause) failed(now time.Time) {
	n := min(p.failures.Add(1), 6)
	p.until.Store(now.Add(min(time.Second<<(n-1), 30*time.Second)).UnixNano())
}

// tokenize fills breq's token blocks, or leaves them nil when the request
// cannot be tokenized in proxy.tokenize_timeout (no backend ready, a
// backend without /tokenize, a cache salt, which the engines hash into
// their blocks and the index does not), so that its pick reads the
// prompt-text index alone.
func (s *Server) tokenize(ctx context.Context, ex *exchange, breq *balancer.Request) {
	t := s.tok
	req := ex.req
	if t == nil || !s.bal.ReadsCacheEvents() || !req.Kind.generates() || req.CacheSalt != "" || ex.holder != nil {
		return
	}
	// Chat and completions go to /tokenize. The Responses and Messages
	// APIs go to vLLM's render endpoints, which answer the prompt's
	// tokens as a GenerateRequest (token_ids; vLLM's
	// vllm/entrypoints/serve/disagg/protocol.py at 06408932), and which
	// vLLM serves with --enable-scale-out.
	path, p := "tokenize", &t.tok
	switch req.Kind {
	case KindResponses:
		path, p = "v1/responses/render", &t.render
	case KindMessages:
		path, p = "v1/messages/render", &t.render
	}
	bs := t.store.BlockSize()
	if bs <= 0 {
		return // no backend has stored a block yet
	}
	now := time.Now()
	if now.UnixNano() < p.until.Load() {
		return
	}
	be := t.backend(s.bal.Snapshot(), breq.Model)
	if be == nil {
		return
	}
	lora := ""
	if !slices.Contains(be.Models, breq.Model) {
		lora = breq.Model // an adapter: its blocks are keyed by its name
	}
	var body []byte
	if req.Kind == KindCompletion {
		// Only what the tokenizer reads: vLLM logs every field it
		// ignores, and a completion's tokens depend on nothing else.
		if len(req.Prompt) == 0 || req.Prompt[0] != '"' {
			return // token ids or a batch: /tokenize takes one string
		}
		m, _ := json.Marshal(breq.Model)
		body = slices.Concat([]byte(`{"model":`), m, []byte(`,"prompt":`), req.Prompt, []byte(`}`))
	} else {
		// A chat's tokens depend on its tools and template arguments
		// too (a Message's and a Response's likewise); the body goes
		// whole, its sampling fields ignored (and logged) by the server.
		body = req.Body
		if breq.Model != req.Model {
			var err error
			if body, err = setModel(body, breq.Model); err != nil {
				return
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.TokenizeTimeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, be.URL.JoinPath(path).String(), bytes.NewReader(body))
	if err != nil {
		return
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(hr)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			p.failed(now) // not the client going away
		}
		s.metrics.tokenize.WithLabelValues("error").Inc()
		return
	}
	defer resp.Body.Close()
	var out struct {
		Tokens   []uint32 `json:"tokens"`    // /tokenize
		TokenIDs []uint32 `json:"token_ids"` // render
	}
	ok := resp.StatusCode == http.StatusOK && json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 64<<20)).Decode(&out) == nil
	if len(out.Tokens) == 0 {
		out.Tokens = out.TokenIDs
	}
	if !ok || len(out.Tokens) == 0 {
		if resp.StatusCode < 400 || resp.StatusCode == http.StatusNotFound || resp.StatusCode >= 500 {
			p.failed(now) // not this prompt's fault (400: too long, say), the server's
		}
		s.metrics.tokenize.WithLabelValues("error").Inc()
		return
	}
	p.failures.Store(0)
	s.metrics.tokenize.WithLabelValues("ok").Inc()
	breq.TokenBlocks, breq.TokenBlockSize = kvevents.Blocks(nil, out.Tokens, bs, lora), bs
	breq.PromptTokens = len(out.Tokens)
}
