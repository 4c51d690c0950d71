package bench

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/llmlb/llmlb/sim"
)

// Part is a run of deterministic prompt text: the same ID always gives the
// same text, and a shorter Tokens gives a prefix of a longer one; different
// IDs share no prefix.
type Part struct {
	ID     uint64
	Tokens int
}

// Request is one arrival of a workload.
type Request struct {
	At        time.Duration
	Parts     []Part
	MaxTokens int
	Model     string // the model or LoRA adapter asked for; "" is the base model
	// System is how many leading parts are the system prompt; the first
	// user message starts after them.
	System int
	// FirstParts, when positive, is how many leading parts are the
	// conversation's first turn, system prompt and first user message
	// alike: a trace's, which knows where the turn ends but not where the
	// user's message starts.
	FirstParts int
	// Session, when not 0, names the agent session the request is a turn
	// of, and Turn is its place in it, from 0. A later turn is sent Think
	// after the session's previous turn is answered, and never if that
	// turn was not (an agent waits for the model's answer and the tool
	// it called, and stops at an error); its At is its session's start.
	Session uint64
	Turn    int
	Think   time.Duration
	// API is the API the request is sent to. The emulation routes every
	// API alike, on the whole prompt, except a Stored follow-up.
	API API
	// Priority is the request's admission priority, as X-Llmlb-Priority
	// sends it: negative is sheddable. 0 is the default.
	Priority int
	// SLO, when set, is the request's own latency targets, sent as
	// x-slo-ttft-ms and x-slo-tpot-ms are: the balancer is told the TTFT
	// deadline ([balancer.Request.TTFTDeadline], from the arrival), and
	// the request is judged by them. In a workload where some request
	// has targets of its own ([Workload.OwnTargets]), one without any is
	// met if it is served; elsewhere every request is judged by the run's
	// targets ([Cluster.SLO]), which the balancer is not told.
	SLO SLO
	// Affinity is the session-affinity header's value the request is sent
	// with, "" for none.
	Affinity string
	// Backend is the backend a trace says answered the request, "" when
	// it does not say; a pinned run ([Cluster.Pinned]) sends it to the
	// server standing for that backend.
	Backend string
	// Stored, when positive, makes the request a Responses API follow-up
	// naming its session's previous turn (previous_response_id): its
	// first Stored parts are the conversation the server that answered
	// that turn keeps and prepends, and its body carries only the rest,
	// so the engine computes the whole prompt while the balancer sees
	// only the new input. 0: the request carries its whole prompt.
	Stored int
}

// API is the API a request is sent to.
type API uint8

const (
	// APIChat is OpenAI's chat completions, the zero value (and the
	// traces' prompts).
	APIChat API = iota
	// APIResponses is OpenAI's Responses API.
	APIResponses
	// APIMessages is Anthropic's Messages API, which keeps no state: the
	// whole conversation is resent each turn.
	APIMessages
)

// String is the API's name.
func (a API) String() string {
	switch a {
	case APIResponses:
		return "responses"
	case APIMessages:
		return "messages"
	}
	return "chat"
}

// AppendNewText appends the text the request's body carries: the whole
// prompt, or a Stored follow-up's new input.
func (r *Request) AppendNewText(dst []byte) []byte {
	for _, p := range r.Parts[min(r.Stored, len(r.Parts)):] {
		dst = appendPart(dst, p)
	}
	return dst
}

// NewTokens is the length in tokens of the text the body carries.
func (r *Request) NewTokens() int {
	n := 0
	for _, p := range r.Parts[min(r.Stored, len(r.Parts)):] {
		n += p.Tokens
	}
	return n
}

// AppendUserText appends the first n bytes of the first user message: the
// text after the system parts.
func (r *Request) AppendUserText(dst []byte, n int) []byte {
	start := len(dst)
	for _, p := range r.Parts[min(r.System, len(r.Parts)):] {
		dst = appendPart(dst, p)
		if len(dst)-start >= n {
			return dst[:start+n]
		}
	}
	return dst
}

// FirstTurn is where the first user message begins and ends in the
// prompt's text, as [prefix.Parts] has them for a chat; for a trace's
// request, 0 and the end of its FirstParts, or zeros when it has none.
func (r *Request) FirstTurn() (user, end int) {
	if r.FirstParts > 0 {
		for _, p := range r.Parts[:min(r.FirstParts, len(r.Parts))] {
			end += 4 * p.Tokens
		}
		return 0, end
	}
	if r.System == 0 || r.System >= len(r.Parts) {
		return 0, 0
	}
	for _, p := range r.Parts[:r.System] {
		user += 4 * p.Tokens
	}
	return user, user + 4*r.Parts[r.System].Tokens
}

// Tokens is the prompt's length in tokens.
func (r *Request) Tokens() int {
	n := 0
	for _, p := range r.Parts {
		n += p.Tokens
	}
	return n
}

// AppendText appends the prompt text, 4 bytes a token.
func (r *Request) AppendText(dst []byte) []byte {
	for _, p := range r.Parts {
		dst = appendPart(dst, p)
	}
	return dst
}

const letters = "etaoinshrdlucmfwypvbgkjqxz      "

// appendPart writes p's text: words of pseudo-random letters from a
// generator seeded by the ID alone.
func appendPart(dst []byte, p Part) []byte {
	r := rand.NewPCG(p.ID, 0x9e3779b97f4a7c15)
	n := p.Tokens * 4
	for n > 0 {
		v := r.Uint64()
		for i := 0; i < 8 && n > 0; i++ {
			dst = append(dst, letters[v&31])
			v >>= 8
			n--
		}
	}
	return dst
}

// Workload is a named list of arrivals, in time order.
type Workload struct {
	Name     string
	Requests []Request
	// Adapters are LoRA adapters the servers must serve.
	Adapters []string
	// Rate is the arrival-rate factor the workload was built with.
	Rate float64
}

// OwnTargets reports whether some request carries latency targets of its
// own ([Request.SLO]): then each request is judged by its own, and the
// run's targets are not used.
func (w *Workload) OwnTargets() bool {
	for i := range w.Requests {
		if w.Requests[i].SLO.set() {
			return true
		}
	}
	return false
}

// hasSessions reports whether some request waits for an earlier one's
// answer ([Request.Session]).
func (w *Workload) hasSessions() bool {
	for i := range w.Requests {
		if w.Requests[i].Turn > 0 {
			return true
		}
	}
	return false
}

// Names of the built-in workloads, in the order the benchmark runs them.
var workloadNames = []string{"mooncake-conversation", "mooncake-synthetic", "shared-prefix", "multi-turn", "lora", "burst", "agentic"}

// WorkloadNames lists the built-in workloads.
func WorkloadNames() []string { return slices.Clone(workloadNames) }

// pdWorkloadNames are the built-in workloads of the P/D comparison
// ([PDOptions]), which the default run leaves out: their prompts share
// nothing, so they say nothing about routing by cache.
var pdWorkloadNames = []string{"long-prompt", "mixed"}

// otherWorkloadNames are built-in workloads run only when named.
var otherWorkloadNames = []string{"prefix-groups", "slo-mixed"}

// OtherWorkloadNames lists the built-in workloads run only when named.
func OtherWorkloadNames() []string { return slices.Clone(otherWorkloadNames) }

// PDWorkloadNames lists the workloads a P/D comparison runs by default.
func PDWorkloadNames() []string { return slices.Clone(pdWorkloadNames) }

// Params size a built-in workload. Zero fields take the workload's default.
type Params struct {
	// Rate multiplies the arrival rate (and so divides the trace's time).
	Rate float64
	// Scale multiplies the number of requests (or groups) a synthetic
	// workload makes; traces are cut to their first Scale share.
	Scale float64
	Seed  uint64
	// Traces are the traces a run's workloads share, each parsed once;
	// nil parses a trace for every workload that replays it.
	Traces *Traces `json:"-"`
}

//go:embed traces/*.jsonl.gz
var traces embed.FS

// Build makes a built-in workload.
func Build(name string, p Params) (*Workload, error) {
	if p.Scale <= 0 {
		p.Scale = 1
	}
	rng := rand.New(rand.NewPCG(p.Seed, 0x5eed))
	var w *Workload
	var err error
	switch name {
	case "mooncake-conversation", "mooncake-synthetic":
		w, err = mooncake(name, p)
	case "shared-prefix":
		w = sharedPrefix(p, rng)
	case "multi-turn":
		w = multiTurn(p, rng)
	case "lora":
		w = loraMix(p, rng)
	case "burst":
		w = burst(p, rng)
	case "agentic":
		w = agentic(p, rng)
	case "long-prompt":
		w = longPrompt(p, rng)
	case "mixed":
		w = mixed(p, rng)
	case "prefix-groups":
		w = prefixGroups(p, rng)
	case "slo-mixed":
		w = sloMixed(p, rng)
	default:
		if files, ok := traceFiles(name); ok {
			w, err = fromFiles(name, files, p)
			break
		}
		return nil, fmt.Errorf("unknown workload %q (have %v)", name, slices.Concat(workloadNames, pdWorkloadNames, otherWorkloadNames))
	}
	if err != nil {
		return nil, err
	}
	w.Name = name
	sort.SliceStable(w.Requests, func(i, j int) bool { return w.Requests[i].At < w.Requests[j].At })
	return w, nil
}

// defaultRate is each workload's arrival-rate factor when none is given,
// chosen so that eight emulated servers (six h100-8b, two a100-8b) are
// busy but not drowning under the round-robin baseline.
var defaultRate = map[string]float64{
	"mooncake-conversation": 1.5,
	"mooncake-synthetic":    1.5,
	"shared-prefix":         1,
	"multi-turn":            1,
	"lora":                  1,
	"burst":                 1,
	"agentic":               1,
	"long-prompt":           1,
	"mixed":                 1,
	"prefix-groups":         1,
	"slo-mixed":             1,
}

func rate(name string, p Params) float64 {
	if p.Rate > 0 {
		return p.Rate
	}
	if r, ok := defaultRate[name]; ok {
		return r
	}
	return 1 // a trace file's own
}

// traceLine is one request of a Mooncake trace, with the fields a capture
// adds (capture.Line), each zero when the line has none.
type traceLine struct {
	Timestamp    int64    `json:"timestamp"` // ms
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	// BlockTokens is the tokens an id stands for when a capture says
	// (capture.block_tokens); 0: the format's 512.
	BlockTokens int `json:"block_tokens"`

	API          string  `json:"api"`
	Priority     int     `json:"priority"`
	MaxTokens    int     `json:"max_tokens"`
	Session      uint64  `json:"session"`
	Conversation uint64  `json:"conversation"`
	PromptTokens *int    `json:"prompt_tokens"`
	CachedTokens *int    `json:"cached_tokens"`
	Backend      string  `json:"backend"`
	Status       int     `json:"status"`
	TTFTms       float64 `json:"ttft_ms"`
	DurationMs   float64 `json:"duration_ms"`
}

// parseTraceLine reads one line of a trace: a request needs a positive
// input length and an arrival not before the trace's start.
func parseTraceLine(b []byte) (traceLine, error) {
	var t traceLine
	if err := json.Unmarshal(b, &t); err != nil {
		return t, err
	}
	switch {
	case t.InputLength < 1:
		return t, fmt.Errorf("input_length %d: a request has a prompt of 1 token or more", t.InputLength)
	case t.Timestamp < 0 || t.Timestamp > 1<<40:
		return t, fmt.Errorf("timestamp %d: arrivals count from the trace's start, in ms", t.Timestamp)
	case t.OutputLength < 0 || t.MaxTokens < 0:
		return t, fmt.Errorf("output_length %d, max_tokens %d: not negative", t.OutputLength, t.MaxTokens)
	case t.BlockTokens < 0 || t.BlockTokens > 1<<20:
		return t, fmt.Errorf("block_tokens %d: not a block", t.BlockTokens)
	case len(t.HashIDs) > 1<<16:
		return t, fmt.Errorf("%d hash_ids: at most 65,536", len(t.HashIDs))
	}
	return t, nil
}

// Traces holds the embedded traces a run has parsed, so that the
// workloads of a sweep, which replay one trace at many rates, parse it
// once. The zero value is ready; it is safe for concurrent use.
type Traces struct {
	m sync.Map // file name -> *parsedTrace
}

type parsedTrace struct {
	once  sync.Once
	lines []traceLine
	err   error
}

// load returns the requests of the embedded trace file, parsed once per
// ts; a nil ts parses it again.
func (ts *Traces) load(file string) ([]traceLine, error) {
	if ts == nil {
		return parseTrace(file)
	}
	v, _ := ts.m.LoadOrStore(file, new(parsedTrace))
	pt := v.(*parsedTrace)
	pt.once.Do(func() { pt.lines, pt.err = parseTrace(file) })
	return pt.lines, pt.err
}

func parseTrace(file string) ([]traceLine, error) {
	f, err := traces.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	out, err := scanTrace(zr, file, nil)
	if err != nil {
		return nil, err
	}
	for i, t := range out {
		if len(t.HashIDs) == 0 {
			return nil, fmt.Errorf("%s: request %d: empty request", file, i+1)
		}
	}
	return out, nil
}

// maxTraceLine bounds one line of a trace: a capture's line holds at most
// 4,096 ids of 16 digits.
const maxTraceLine = 1 << 20

// scanTrace appends the requests of the trace r holds, one JSON line each
// ([parseTraceLine]; blank lines skipped), to lines; an error names the
// trace by name and line.
func scanTrace(r io.Reader, name string, lines []traceLine) ([]traceLine, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		t, err := parseTraceLine(sc.Bytes())
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		lines = append(lines, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return lines, nil
}

// mooncake replays a Mooncake trace: each hash id is a 512-token block of
// text of its own, the last block cut to the input length.
func mooncake(name string, p Params) (*Workload, error) {
	file := "traces/mooncake_conversation.jsonl.gz"
	if name == "mooncake-synthetic" {
		file = "traces/mooncake_synthetic.jsonl.gz"
	}
	lines, err := p.Traces.load(file)
	if err != nil {
		return nil, err
	}
	if p.Scale < 1 {
		lines = lines[:max(1, int(float64(len(lines))*p.Scale))]
	}
	r := rate(name, p)
	w := &Workload{Rate: r}
	for _, t := range lines {
		req := Request{At: time.Duration(float64(t.Timestamp) / r * float64(time.Millisecond)), MaxTokens: max(1, t.OutputLength)}
		left := t.InputLength
		for _, id := range t.HashIDs {
			n := min(512, left)
			if n <= 0 {
				break
			}
			req.Parts = append(req.Parts, Part{ID: id + 1<<40, Tokens: n})
			left -= n
		}
		w.Requests = append(w.Requests, req)
	}
	return w, nil
}

// poisson returns n arrival times at rate per second.
func poisson(rng *rand.Rand, n int, perSecond float64) []time.Duration {
	out := make([]time.Duration, n)
	var t float64
	for i := range out {
		t += rng.ExpFloat64() / perSecond
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

// sharedPrefix is shaped like llm-d's "KV-cache wins" benchmark: 150
// tenant groups, each with a 6,000-token system prompt, 5 users a group,
// each asking 1,200-token questions; Poisson arrivals over randomly chosen
// users.
func sharedPrefix(p Params, rng *rand.Rand) *Workload {
	groups := max(1, int(150*p.Scale))
	const users, perUser = 5, 4
	r := rate("shared-prefix", p)
	n := groups * users * perUser
	at := poisson(rng, n, 12*r)
	w := &Workload{Rate: r}
	for i := range n {
		g := uint64(rng.IntN(groups))
		u := uint64(rng.IntN(users))
		w.Requests = append(w.Requests, Request{
			At:        at[i],
			Parts:     []Part{{ID: 1<<32 + g, Tokens: 6000}, {ID: 2<<32 + g<<8 + u<<4 + uint64(i%16), Tokens: 1200}},
			System:    1,
			MaxTokens: 200,
		})
	}
	return w
}

// prefixGroups is inference-perf's shared_prefix data as issue 56 ran it
// against llm-d's simulator: 20 groups of a 3,000-token system prompt, 5
// prompts a group each adding a 600-token question (tokens as llm-d-sim's
// engines count them, [LLMDSimTokenizer] bytes each), sent in a shuffled
// order over and over (inference-perf cycles through its prompts:
// kubernetes-sigs/inference-perf,
// inference_perf/datagen/shared_prefix_datagen.py at 3788ed5a), up to
// 1,000 output tokens (uniform: the simulator answers a random length up
// to max_tokens), Poisson arrivals at 8/s (rate 2 is the 16/s),
// 1,200 requests.
func prefixGroups(p Params, rng *rand.Rand) *Workload {
	const groups, prompts = 20, 5
	order := rng.Perm(groups * prompts)
	r := rate("prefix-groups", p)
	n := max(1, int(1200*p.Scale))
	w := &Workload{Rate: r}
	for i, at := range poisson(rng, n, 8*r) {
		k := uint64(order[i%len(order)])
		g := k / prompts
		w.Requests = append(w.Requests, Request{
			At:        at,
			Parts:     []Part{{ID: 15<<32 + g, Tokens: simTokens(3000)}, {ID: 16<<32 + k, Tokens: simTokens(600)}},
			System:    1,
			MaxTokens: 1 + rng.IntN(1000),
		})
	}
	return w
}

// simTokens is how many of the workloads' tokens make n of llm-d-sim's.
func simTokens(n int) int { return int(math.Round(float64(n) * LLMDSimTokenizer / sim.BytesPerToken)) }

// multiTurn: conversations whose every turn resends the whole history (a
// system prompt, then each user message and answer so far) plus a new
// question; a user thinks about 20 s between turns.
func multiTurn(p Params, rng *rand.Rand) *Workload {
	convs := max(1, int(240*p.Scale))
	const turns = 8
	r := rate("multi-turn", p)
	starts := poisson(rng, convs, 2*r)
	w := &Workload{Rate: r}
	for c := range convs {
		sys := Part{ID: 3<<32 + uint64(rng.IntN(8)), Tokens: 1500} // a few shared system prompts
		hist := []Part{sys}
		t := starts[c]
		for turn := range turns {
			q := Part{ID: 4<<32 + uint64(c)<<8 + uint64(turn), Tokens: 150 + rng.IntN(300)}
			out := 100 + rng.IntN(300)
			hist = append(hist, q)
			w.Requests = append(w.Requests, Request{At: t, Parts: slices.Clone(hist), MaxTokens: out, System: 1})
			hist = append(hist, Part{ID: 5<<32 + uint64(c)<<8 + uint64(turn), Tokens: out})
			t += time.Duration((10 + rng.ExpFloat64()*10) / r * float64(time.Second))
		}
	}
	return w
}

// loraMix: 16 adapters with Zipf popularity (s = 1.1), each with its own
// 2,000-token instructions, 500-token inputs.
func loraMix(p Params, rng *rand.Rand) *Workload {
	const adapters = 16
	r := rate("lora", p)
	n := max(1, int(3000*p.Scale))
	w := &Workload{Rate: r}
	for i := range adapters {
		w.Adapters = append(w.Adapters, fmt.Sprintf("lora-%02d", i))
	}
	// Zipf weights 1/k^1.1
	cum := make([]float64, adapters)
	var sum float64
	for k := range adapters {
		sum += 1 / math.Pow(float64(k+1), 1.1)
		cum[k] = sum
	}
	at := poisson(rng, n, 25*r)
	for i := range n {
		x := rng.Float64() * sum
		a, _ := slices.BinarySearch(cum, x)
		a = min(a, adapters-1)
		w.Requests = append(w.Requests, Request{
			At:        at[i],
			Model:     w.Adapters[a],
			Parts:     []Part{{ID: 6<<32 + uint64(a), Tokens: 2000}, {ID: 7<<32 + uint64(i), Tokens: 500}},
			System:    1,
			MaxTokens: 150,
		})
	}
	return w
}

// burst: background chat traffic, and three times a burst of 300 requests
// that share a 4,000-token prefix, all within 100 ms.
func burst(p Params, rng *rand.Rand) *Workload {
	r := rate("burst", p)
	w := &Workload{Rate: r}
	bg := max(1, int(600*p.Scale))
	for i, t := range poisson(rng, bg, 10*r) {
		w.Requests = append(w.Requests, Request{At: t, Parts: []Part{{ID: 8<<32 + uint64(i), Tokens: 1000 + rng.IntN(2000)}}, MaxTokens: 200})
	}
	span := w.Requests[len(w.Requests)-1].At
	per := max(1, int(300*p.Scale))
	for b := range 3 {
		start := span * time.Duration(b+1) / 4
		for i := range per {
			w.Requests = append(w.Requests, Request{
				At:        start + time.Duration(rng.Int64N(int64(100*time.Millisecond))),
				Parts:     []Part{{ID: 9<<32 + uint64(b), Tokens: 4000}, {ID: 10<<32 + uint64(b)<<16 + uint64(i), Tokens: 200}},
				MaxTokens: 100,
			})
		}
	}
	return w
}

// agentic: tool-calling agent sessions, over OpenAI's Responses API and
// Anthropic's Messages API. Sessions start as a Poisson process. Each
// sends 4-10 requests: the first is one of four shared system prompts
// with tool definitions (1,800-2,400 tokens: agent harnesses ship long
// ones that many sessions share) and a task; each later one appends the
// model's last answer (a tool call, 50-300 tokens) and the tool's result
// (200-2,000 tokens, log-uniform: mostly short command outputs, now and
// then a whole file), and is sent 1-5 s after that answer (tools are
// fast, and an agent does not stop to think as a person does). Sessions
// go in turn to the Responses API with stored responses (each follow-up
// carries only the tool's result and names the previous response), the
// Responses API without (the whole input resent) and the Messages API
// (the whole conversation resent). Rate multiplies the sessions' start
// rate, not the tools' time.
func agentic(p Params, rng *rand.Rand) *Workload {
	sessions := max(1, int(1200*p.Scale))
	r := rate("agentic", p)
	starts := poisson(rng, sessions, 4*r)
	w := &Workload{Rate: r}
	for s := range sessions {
		sys := rng.IntN(4)
		sid := uint64(s) << 8
		hist := []Part{
			{ID: 15<<32 + uint64(sys), Tokens: 1800 + 200*sys},
			{ID: 16<<32 + sid, Tokens: 100 + rng.IntN(400)},
		}
		api, stored := APIResponses, s%3 == 0
		if s%3 == 2 {
			api = APIMessages
		}
		turns := 4 + rng.IntN(7)
		var think time.Duration
		for turn := range turns {
			out := 50 + rng.IntN(251)
			req := Request{At: starts[s], Parts: slices.Clone(hist), MaxTokens: out, System: 1,
				Session: uint64(s) + 1, Turn: turn, Think: think, API: api}
			if stored && turn > 0 {
				req.Stored = len(hist) - 1 // the tool's result is new
			}
			w.Requests = append(w.Requests, req)
			tool := int(math.Round(200 * math.Pow(10, rng.Float64()))) // 200-2,000, log-uniform
			hist = append(hist, Part{ID: 17<<32 + sid + uint64(turn), Tokens: out}, Part{ID: 18<<32 + sid + uint64(turn), Tokens: tool})
			think = time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
		}
	}
	return w
}

// longPrompt: documents of 3,000-7,000 tokens that share nothing, each
// asked for a 200-400-token answer, at Poisson arrivals of 6 a second:
// the prefill-heavy load that disaggregation is for (a long prefill in a
// colocated server's batch stalls the decodes beside it).
func longPrompt(p Params, rng *rand.Rand) *Workload {
	n := max(1, int(1500*p.Scale))
	r := rate("long-prompt", p)
	w := &Workload{Rate: r}
	for i, t := range poisson(rng, n, 6*r) {
		w.Requests = append(w.Requests, Request{At: t, Parts: []Part{{ID: 19<<32 + uint64(i), Tokens: 3000 + rng.IntN(4001)}},
			MaxTokens: 200 + rng.IntN(201)})
	}
	return w
}

// mixed: chat requests and documents at Poisson arrivals of 10 a second.
// Four in five are chats: one of eight 1,000-token system prompts and a
// question of 100-600 tokens, answered in 100-400 tokens, so that a
// server holding the system prompt lacks only the question. The fifth is
// a 6,000-10,000-token document that shares nothing, asked for 100-200
// tokens. The chats' decodes share servers with the documents' prefills.
func mixed(p Params, rng *rand.Rand) *Workload {
	return chatsAndDocs{name: "mixed", requests: 2500, perSecond: 10, docEvery: 5,
		system: 22 << 32, question: 20 << 32, doc: 21 << 32,
		chatOut: [2]int{100, 400}, docTokens: [2]int{6000, 10000}, docOut: [2]int{100, 200}}.build(p, rng)
}

// sloMixed: interactive chats with deadlines and sheddable batch
// documents without, 3,000 at Poisson arrivals of 30 a second (about
// where the round-robin baseline on the eight default servers starts to
// miss: busy, not drowning). It is the mix that goodput is judged on
// (requests meeting their targets per second, as DistServe, Zhong et al.,
// OSDI 2024, compares systems) and that llm-d's SLO-aware routing is for (x-slo-ttft-ms and x-slo-tpot-ms, read per
// request; a request of negative priority is sheddable and refused when
// no server can meet its deadline: llm-d/llm-d-router
// pkg/epp/framework/plugins/requestcontrol/admitter/latencyslo/README.md
// and scheduling/filter/sloheadroomtier/README.md at ebab6879;
// llm-d.ai/docs/architecture/advanced/latency-predictor).
//
// Three in four are interactive, priority 0: one of eight 1,000-token
// system prompts and a question of 100-600 tokens, answered in 50-300
// tokens (Splitwise's conversation trace, Patel et al., ISCA 2024: a
// median prompt of 1,020 tokens, a median answer of 129), each with its
// own targets: the first token within 250 ms of its arrival and 50 ms a
// token after it. 250 ms is DistServe's chatbot TTFT target (Table 1,
// OPT-13B on A100s); its TPOT target there, 100 ms, would never bind an
// 8B model on an H100 (about 7-11 ms a token up to 16 concurrent
// requests), so the TPOT target is the level of a heavily batched server,
// 47 ms at 64 clients in the h100-8b preset's calibration source. The
// fourth is a batch job, priority -1 and no targets: a 4,000-8,000-token
// document that shares nothing (DistServe's summarization workload is of
// long documents), answered in 200-600 tokens. Its prefill is what makes
// a chat that lands beside it miss its deadline.
func sloMixed(p Params, rng *rand.Rand) *Workload {
	return chatsAndDocs{name: "slo-mixed", requests: 3000, perSecond: 30, docEvery: 4,
		system: 23 << 32, question: 24 << 32, doc: 25 << 32,
		chatOut: [2]int{50, 300}, docTokens: [2]int{4000, 8000}, docOut: [2]int{200, 600},
		chatSLO: SLO{TTFT: 250 * time.Millisecond, TPOT: 50 * time.Millisecond}, docPriority: -1}.build(p, rng)
}

// chatsAndDocs is the shape mixed and slo-mixed share: Poisson arrivals,
// each a chat on one of eight 1,000-token system prompts with a question
// of 100-600 tokens, or one time in docEvery a document that shares
// nothing. Ranges are inclusive; the IDs are each part's own prefix.
type chatsAndDocs struct {
	name                  string
	requests              int     // at Scale 1
	perSecond             float64 // at Rate 1
	docEvery              int
	system, question, doc uint64
	chatOut               [2]int
	docTokens, docOut     [2]int
	chatSLO               SLO // each chat's own targets; zero: none
	docPriority           int
}

func (m chatsAndDocs) build(p Params, rng *rand.Rand) *Workload {
	n := max(1, int(float64(m.requests)*p.Scale))
	r := rate(m.name, p)
	w := &Workload{Rate: r}
	between := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	for i, t := range poisson(rng, n, m.perSecond*r) {
		q := Request{At: t, Parts: []Part{{ID: m.system + uint64(rng.IntN(8)), Tokens: 1000}, {ID: m.question + uint64(i), Tokens: between(100, 600)}},
			System: 1, MaxTokens: between(m.chatOut[0], m.chatOut[1]), SLO: m.chatSLO}
		if rng.IntN(m.docEvery) == 0 {
			q = Request{At: t, Parts: []Part{{ID: m.doc + uint64(i), Tokens: between(m.docTokens[0], m.docTokens[1])}},
				MaxTokens: between(m.docOut[0], m.docOut[1]), Priority: m.docPriority}
		}
		w.Requests = append(w.Requests, q)
	}
	return w
}
