package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/proxy"
)

// HTTPReplay replays workloads over real HTTP against a running balancer (or
// any OpenAI-compatible server), in real time.
type HTTPReplay struct {
	// URL is the server's base URL, without /v1.
	URL string
	// Model is the base model every request without a LoRA adapter asks
	// for; "" asks the server's /v1/models for its first base model.
	Model string
	// Client sends the requests; nil is a client without timeouts, so
	// that long generations are measured, not cut.
	Client *http.Client
	// Progress, if set, gets a progress line every second.
	Progress io.Writer
	// Label names the result's row; "" is "target".
	Label string
}

// Replay sends every request of w at its arrival time as a streaming
// /v1/completions request asking for the final usage chunk, and measures
// what the client sees: time to the first token event, time to the end of
// the stream, output tokens and cached prompt tokens from the usage chunk,
// and which backend answered. Refused counts 429 and 503 answers (the
// balancer's admission queue); Failed counts every other error, including
// a stream that ends without [DONE]. The result's Policy is the Label.
//
// A workload whose turns wait for earlier answers (agentic) is refused: the
// replay sends at fixed times and keeps no responses to continue.
func (t *HTTPReplay) Replay(ctx context.Context, w *Workload) (Result, error) {
	if w.hasSessions() {
		return Result{}, fmt.Errorf("bench: %s: its turns wait for earlier turns' answers, which the HTTP replay does not do", w.Name)
	}
	client := t.Client
	if client == nil {
		client = &http.Client{}
	}
	base := strings.TrimRight(t.URL, "/")
	model := t.Model
	if model == "" {
		m, err := firstBaseModel(ctx, client, base)
		if err != nil {
			return Result{}, err
		}
		model = m
	}
	res := Result{Policy: t.Label}
	if res.Policy == "" {
		res.Policy = "target"
	}
	var (
		mu       sync.Mutex
		perBE    = map[string]int{}
		done     int
		wg       sync.WaitGroup
		lastEnd  time.Time
		errFirst error
	)
	type served struct {
		ttft, e2e time.Duration
		ok        bool
	}
	outs := make([]served, len(w.Requests))
	start := time.Now()
	progress := func() {
		if t.Progress == nil {
			return
		}
		mu.Lock()
		fmt.Fprintf(t.Progress, "\rbench: %s: %d/%d answered, %d refused, %d failed, %s   ",
			w.Name, done, len(w.Requests), res.Refused, res.Failed, time.Since(start).Round(time.Second))
		mu.Unlock()
	}
	stopTicker := make(chan struct{})
	var tickerDone sync.WaitGroup
	tickerDone.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				progress()
			case <-stopTicker:
				return
			}
		}
	})
	timer := time.NewTimer(time.Hour)
	timer.Stop()
send:
	for i := range w.Requests {
		req := &w.Requests[i]
		if wait := time.Until(start.Add(req.At)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				break send
			}
		}
		wg.Go(func() {
			m := model
			if req.Model != "" {
				m = req.Model
			}
			sent := time.Now()
			o := sendOne(ctx, client, base, m, req)
			end := time.Now()
			mu.Lock()
			defer mu.Unlock()
			done++
			switch {
			case o.refused:
				res.Refused++
			case o.err != nil:
				res.Failed++
				if errFirst == nil && ctx.Err() == nil {
					errFirst = fmt.Errorf("request %d: %w", i, o.err)
				}
			default:
				outs[i] = served{o.ttft, end.Sub(sent), true}
				res.OutputTokens += int64(o.completion)
				res.PromptTokens += int64(o.prompt)
				res.CachedTokens += int64(o.cached)
				if o.backend != "" {
					perBE[o.backend]++
				}
				lastEnd = end
			}
		})
	}
	wg.Wait()
	close(stopTicker)
	tickerDone.Wait()
	progress()
	if t.Progress != nil {
		fmt.Fprintln(t.Progress)
	}
	for _, o := range outs {
		if o.ok {
			res.TTFT = append(res.TTFT, o.ttft)
			res.E2E = append(res.E2E, o.e2e)
		}
	}
	if !lastEnd.IsZero() {
		res.Duration = lastEnd.Sub(start)
	}
	names := make([]string, 0, len(perBE))
	for n := range perBE {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		res.PerBackend = append(res.PerBackend, perBE[n])
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if res.Failed > 0 && len(res.TTFT) == 0 {
		return res, fmt.Errorf("bench: every request to %s failed; the first: %w", base, errFirst)
	}
	return res, nil
}

// outcome is one request's fate.
type outcome struct {
	ttft                       time.Duration
	prompt, completion, cached int
	backend                    string
	refused                    bool
	err                        error
}

// completionRequest is the body Replay sends. ignore_eos asks vLLM and
// SGLang for exactly max_tokens, so output lengths are the workload's.
type completionRequest struct {
	Model         string        `json:"model"`
	Prompt        string        `json:"prompt"`
	MaxTokens     int           `json:"max_tokens"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
	IgnoreEOS     bool          `json:"ignore_eos"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chunk is the part of a streamed completion event Replay reads.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"` // chat streams
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func sendOne(ctx context.Context, client *http.Client, base, model string, r *Request) outcome {
	body, _ := json.Marshal(completionRequest{
		Model: model, Prompt: string(r.AppendText(nil)), MaxTokens: r.MaxTokens,
		Stream: true, StreamOptions: streamOptions{IncludeUsage: true}, IgnoreEOS: true,
	})
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return outcome{err: err}
	}
	hreq.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := client.Do(hreq)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	o := outcome{backend: resp.Header.Get(proxy.HeaderBackend)}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		o.refused = true
		return o
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		o.err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
		return o
	}
	events := 0
	u, err := ReadStream(resp.Body, func() {
		if events == 0 {
			o.ttft = time.Since(sent)
		}
		events++
	})
	if err == nil && events == 0 {
		err = errors.New("stream had no tokens")
	}
	if err != nil {
		o.err = err
		return o
	}
	o.prompt, o.completion, o.cached = u.Prompt, u.Completion, u.Cached
	if o.completion == 0 { // a server that ignored include_usage
		o.completion = events
	}
	if o.prompt == 0 {
		o.prompt = r.Tokens()
	}
	return o
}

// StreamUsage is what a stream's usage chunk says; zero when it had none.
type StreamUsage struct{ Prompt, Completion, Cached int }

// ReadStream reads a streamed completion or chat completion (OpenAI
// server-sent events) to its [DONE], calling token as each event carrying
// text (a chat delta's content) arrives, and
// returns the usage chunk's counts. An error event, an event that is not
// JSON, or an end before [DONE] is an error. The HTTP replay and the
// overhead benchmark's load generator both read streams with it.
func ReadStream(body io.Reader, token func()) (StreamUsage, error) {
	var u StreamUsage
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if bytes.Equal(data, []byte("[DONE]")) {
			return u, nil
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return u, fmt.Errorf("stream event %.80q: %w", data, err)
		}
		if c.Error != nil {
			return u, fmt.Errorf("error in stream: %s", c.Error.Message)
		}
		if len(c.Choices) > 0 && (c.Choices[0].Text != "" || c.Choices[0].Delta.Content != "") {
			token()
		}
		if cu := c.Usage; cu != nil {
			u.Prompt, u.Completion = cu.PromptTokens, cu.CompletionTokens
			if cu.PromptTokensDetails != nil {
				u.Cached = cu.PromptTokensDetails.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		return u, err
	}
	return u, errors.New("stream ended without [DONE]")
}

// firstBaseModel asks base/v1/models for its first model that is not a
// LoRA adapter (vLLM lists adapters with a parent).
func firstBaseModel(ctx context.Context, client *http.Client, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("bench: --target: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("bench: --target: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("bench: --target: GET %s/v1/models: %s", base, resp.Status)
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list); err != nil {
		return "", fmt.Errorf("bench: --target: GET %s/v1/models: %w", base, err)
	}
	for _, m := range list.Data {
		if m.Parent == nil || *m.Parent == "" {
			return m.ID, nil
		}
	}
	return "", fmt.Errorf("bench: --target: %s/v1/models lists no base model; name one with --model", base)
}
