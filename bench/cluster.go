package bench

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/wire"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// Model is the base model the emulated cluster serves.
const Model = "llama-3.1-8b"

// Cluster describes the emulated servers and the balancer in front of them.
type Cluster struct {
	// Presets names each server's engine preset (sim.Preset), one entry a
	// server.
	Presets []string
	// Engine is the /metrics flavour the servers render and the scraper
	// reads; "sglang" servers also take a prefix into their cache only
	// once it is computed (sim.EngineConfig.CacheOnCompute). (default
	// "vllm")
	Engine string
	// Policy is the balancer policy: a preset name (balancer.Presets) or
	// "default".
	Policy string
	// Balancer is the base balancer configuration; Policy overrides its
	// policy. Zero means balancer.DefaultConfig().
	Balancer *balancer.Config
	// Prefix configures the prefix index (prefix.DefaultConfig() when
	// zero); the epp preset uses the endpoint picker's own sizes.
	Prefix *prefix.Config
	// ScrapeInterval is the time between scrapes of one server (default:
	// the preset's, else 100ms, as `llmlb serve` does); each is jittered
	// ±10%.
	ScrapeInterval time.Duration
	// Replicas is how many independent balancers run side by side, each
	// with its own index, ledger, admission queue and scrapes of every
	// server; each arrival goes to one at random, as a Kubernetes Service
	// spreads connections. (default 1)
	Replicas int
	// Seed seeds the scrape jitter and the policies' randomness.
	Seed uint64
	// Perturb scales the engines' real costs without telling the
	// balancer, to see how a policy degrades when its model of the engine
	// is wrong. Zero is no change.
	Perturb Perturb
	// KVEvents: the servers publish their KV-cache events, as vLLM does
	// with --kv-events-config, and a policy that reads them (the default,
	// through kvevents) has each request tokenized before its pick, as
	// `llmlb serve` asks a server's /tokenize. A step's events reach the
	// balancers KVEventLag after it ends (default 2ms); tokenizing takes
	// TokenizeBase plus TokenizePerByte a prompt byte (defaults 2ms and
	// 80ns: a local HTTP round trip to a tokenizer, and a quarter of the
	// rate huggingface/tokenizers' README gives, "less than 20 seconds to
	// tokenize a GB of text on a server's CPU", for one core rather than
	// all of them; assumptions, not measurements).
	KVEvents                      bool
	KVEventLag                    time.Duration
	TokenizeBase, TokenizePerByte time.Duration
	// Clients, when positive, runs the workload closed-loop instead of at
	// its arrival times: that many clients each send the next request (in
	// arrival order, timestamps ignored) as soon as their previous one is
	// answered, refused or failed, as a benchmark client with a
	// concurrency limit does. The cluster then runs as fast as it can, so
	// the output tokens per second measure what routing lets it serve.
	Clients int
	// Trace records each served request's pick in [Result.Trace]: the
	// caches and prefill work the servers held then ([TraceRecord]).
	Trace bool
}

// Perturb is a change to the emulated engines the balancer is not told
// of. Each factor multiplies; 0 means 1.
type Perturb struct {
	// Prefill scales the prefill costs (per token and attention): a
	// miss dearer or cheaper than the balancer learned at first.
	Prefill float64
	// Request scales the per-request intake (parsing, tokenising,
	// scheduling) a cache hit does not remove.
	Request float64
	// Tokens scales the prompt tokens the balancer is told, as a tokenizer
	// other than the engine's would count them.
	Tokens float64
}

func factor(f float64) float64 {
	if f <= 0 {
		return 1
	}
	return f
}

func scale(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * factor(f)) }

func (p Perturb) apply(c sim.Cost) sim.Cost {
	c.PrefillToken = scale(c.PrefillToken, p.Prefill)
	c.Attention = scale(c.Attention, p.Prefill)
	c.Request = scale(c.Request, p.Request)
	c.RequestToken = scale(c.RequestToken, p.Request)
	return c
}

func (p Perturb) tokens(n int) int { return max(1, int(math.Round(float64(n)*factor(p.Tokens)))) }

// String names the perturbation as --perturb takes it; "" when none.
func (p Perturb) String() string {
	var parts []string
	for _, f := range []struct {
		name string
		v    float64
	}{{"prefill", p.Prefill}, {"request", p.Request}, {"tokens", p.Tokens}} {
		if factor(f.v) != 1 {
			parts = append(parts, fmt.Sprintf("%s=%g", f.name, f.v))
		}
	}
	return strings.Join(parts, ",")
}

// ParsePerturb reads "prefill=2,request=0.5,tokens=0.6".
func ParsePerturb(s string) (Perturb, error) {
	var p Perturb
	if s == "" {
		return p, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || f <= 0 || math.IsInf(f, 0) {
			return p, fmt.Errorf("bench: --perturb %q: want name=factor with a positive factor, as prefill=2", kv)
		}
		switch k {
		case "prefill":
			p.Prefill = f
		case "request":
			p.Request = f
		case "tokens":
			p.Tokens = f
		default:
			return p, fmt.Errorf("bench: --perturb: unknown cost %q (have prefill, request, tokens)", k)
		}
	}
	return p, nil
}

// Result is what one policy did with one workload.
type Result struct {
	Policy       string
	TTFT         []time.Duration // per served request, in arrival order
	E2E          []time.Duration
	OutputTokens int64
	// Duration is from the first arrival (the start of a closed-loop
	// run) to the last completion.
	Duration     time.Duration
	PromptTokens int64 // of served requests
	CachedTokens int64 // of those, served from the engines' prefix caches
	PerBackend   []int // requests served by each server
	Refused      int   // the admission queue refused or timed out
	Failed       int   // no backend, or a server refused the request
	Preemptions  int64
	// Trace holds one record a served request, in first-token order,
	// when the run was traced ([Cluster.Trace]).
	Trace []TraceRecord
}

// event kinds
const (
	evArrival = iota
	evStep
	evScrape
	evEnter
	evTokenized // a request's tokens are back; its pick comes now
	evKV        // server i's KV events reach the balancers
)

type event struct {
	at   time.Duration
	kind int
	i    int     // request index or server index
	rep  int     // replica, for scrapes
	f    *flight // for evEnter
	seq  uint64  // insertion order, to break ties deterministically
}

type events []event

func (q events) Len() int { return len(q) }
func (q events) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q events) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)   { *q = append(*q, x.(event)) }
func (q *events) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// server is one emulated engine in the cluster.
type server struct {
	id      string
	url     *url.URL
	eng     *sim.Engine
	block   int // bytes a KV block holds
	stepEnd time.Duration
	busy    bool // a step is scheduled
	served  int
	kv      []kvBatch // KV events on their way to the balancers, oldest first
}

// kvBatch is one step's KV events and when they reach the balancers.
type kvBatch struct {
	at     time.Duration
	events []sim.KVEvent
}

// replica is one balancer in front of every server.
type replica struct {
	bal     *balancer.Balancer
	scrape  time.Duration
	waiting []*flight // in its admission queue, oldest first
}

// flight is one request on its way through the cluster.
type flight struct {
	req     *Request
	idx     int
	rep     int
	breq    balancer.Request
	guard   *balancer.Guard
	ticket  *balancer.Ticket // its place in the replica's admission queue
	seq     *sim.Seq
	srv     int
	arrived time.Duration
	tokens  []uint32     // the prompt's token ids, when its replica reads KV events
	trace   *TraceRecord // when the run is traced: the pick's record, until the first token
}

// run is the state of one replay.
type run struct {
	c        Cluster
	w        *Workload
	reps     []*replica
	scraper  *scrape.Engine
	servers  []*server
	byID     map[string]int
	q        events
	nseq     uint64
	now      time.Duration
	epoch    time.Time
	rng      *rand.Rand
	res      Result
	ttft     []time.Duration // by request index; -1 not served
	e2e      []time.Duration
	flights  map[*sim.Seq]*flight
	queued   int // flights in admission queues
	entering int // flights picked but not yet at their server
	text     []byte
	// hashes are the engine block hashes of text, for blocks of
	// hashBlock bytes (0: not computed for this request yet); the true
	// cache and the chosen server share them.
	hashes    []uint64
	hashBlock int
	dst       []*balancer.Backend
	out       []sim.Output
	models    []string
	adapts    []balancer.Adapter
	last      time.Duration
	next      int // closed loop: the next request to send
	// kv is the index of the servers' KV events. Every replica reads the
	// one store: real replicas each keep their own, fed the same events
	// at the same lag, so their contents are the same.
	kv     *kvevents.Store
	kvTake []sim.KVEvent
	// A batch's events and hashes as kvevents reads them, reused.
	kvEvents []kvevents.Event
	kvHashes []uint64
}

// Run replays w through the cluster in virtual time and reports what
// happened. It is deterministic for the cluster's seed.
func Run(c Cluster, w *Workload) (Result, error) {
	res, _, err := runWith(c, w)
	return res, err
}

// runWith is Run that also returns the first replica's balancer, for
// tests.
func runWith(c Cluster, w *Workload) (Result, *balancer.Balancer, error) {
	res, bals, err := runAll(c, w)
	if err != nil {
		return res, nil, err
	}
	return res, bals[0], nil
}

// runAll is Run that also returns every replica's balancer, for tests.
func runAll(c Cluster, w *Workload) (Result, []*balancer.Balancer, error) {
	if len(c.Presets) == 0 {
		return Result{}, nil, errors.New("bench: a cluster needs at least one server")
	}
	if c.Engine == "" {
		c.Engine = "vllm"
	}
	c.Replicas = max(1, c.Replicas)
	engines, err := scrape.NewEngineSet(nil)
	if err != nil {
		return Result{}, nil, err
	}
	scraper := engines[c.Engine]
	if scraper == nil {
		return Result{}, nil, fmt.Errorf("bench: unknown engine %q", c.Engine)
	}
	r := &run{c: c, w: w, scraper: scraper, byID: map[string]int{}, flights: map[*sim.Seq]*flight{},
		epoch: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), rng: rand.New(rand.NewPCG(c.Seed, 0xbe7c4))}
	r.res.Policy = c.Policy
	r.models = append([]string{Model}, w.Adapters...)
	for _, a := range w.Adapters {
		r.adapts = append(r.adapts, balancer.Adapter{Name: a, Parent: Model})
	}
	if err := r.build(); err != nil {
		return Result{}, nil, err
	}
	r.loop()
	var bals []*balancer.Balancer
	for _, rep := range r.reps {
		bals = append(bals, rep.bal)
	}
	return r.res, bals, nil
}

func (r *run) clock() time.Time { return r.epoch.Add(r.now) }

func (r *run) build() error {
	bcfg := balancer.DefaultConfig()
	if r.c.Balancer != nil {
		bcfg = *r.c.Balancer
	}
	if r.c.Policy != "" && r.c.Policy != "default" {
		bcfg.Policy = r.c.Policy
	}
	pr, err := balancer.LookupPreset(bcfg.Policy)
	if err != nil {
		return err
	}
	if err := bcfg.Validate(); err != nil && !pr.TrueCache && pr.Scenario == "" {
		return err
	}
	pcfg := prefix.DefaultConfig()
	if r.c.Prefix != nil {
		pcfg = *r.c.Prefix
	}
	interval := r.c.ScrapeInterval
	if interval == 0 {
		interval = pr.ScrapeInterval
	}
	if interval == 0 {
		interval = 100 * time.Millisecond
	}
	for i := range r.c.Replicas {
		// Each replica draws from its own stream, so that adding one does
		// not change what the others do.
		rng := rand.New(rand.NewPCG(r.c.Seed, uint64(i)))
		deps := balancer.Deps{Now: r.clock, Rand: rng.Uint64, Oracle: trueCache{r}}
		if r.c.KVEvents {
			if r.kv == nil {
				r.kv = kvevents.NewStore()
				r.kv.Now = r.clock
			}
			deps.Events = r.kv
		}
		bal, _, err := wire.Balancer(bcfg, pcfg, deps, nil, nil)
		if err != nil {
			return err
		}
		r.reps = append(r.reps, &replica{bal: bal, scrape: interval})
	}
	for i, name := range r.c.Presets {
		cfg, err := sim.Preset(name)
		if err != nil {
			return err
		}
		cfg.Cost = r.c.Perturb.apply(cfg.Cost)
		cfg.CacheOnCompute = sim.CachesOnCompute(r.c.Engine)
		cfg.KVEvents = r.c.KVEvents
		id := fmt.Sprintf("sim-%02d-%s", i, name)
		u, _ := url.Parse("http://" + id + ":8000")
		eng := sim.NewEngine(cfg)
		r.servers = append(r.servers, &server{id: id, url: u, eng: eng, block: eng.Config().BlockSize * sim.BytesPerToken})
		r.byID[id] = i
		// Every replica scrapes every server once before traffic, as
		// discovery does, then on its own jittered interval.
		for rep := range r.reps {
			r.scrapeServer(rep, i)
			r.pushScrape(rep, i)
		}
	}
	if r.c.Clients > 0 {
		r.next = min(r.c.Clients, len(r.w.Requests))
		for i := range r.next {
			r.push(event{at: 0, kind: evArrival, i: i})
		}
	} else {
		for i := range r.w.Requests {
			r.push(event{at: r.w.Requests[i].At, kind: evArrival, i: i})
		}
	}
	r.ttft = make([]time.Duration, len(r.w.Requests))
	r.e2e = make([]time.Duration, len(r.w.Requests))
	for i := range r.ttft {
		r.ttft[i], r.e2e[i] = -1, -1
	}
	r.res.PerBackend = make([]int, len(r.servers))
	return nil
}

func (r *run) push(e event) {
	r.nseq++
	e.seq = r.nseq
	heap.Push(&r.q, e)
}

func (r *run) pushScrape(rep, i int) {
	j := 0.9 + 0.2*r.rng.Float64()
	r.push(event{at: r.now + time.Duration(float64(r.reps[rep].scrape)*j), kind: evScrape, i: i, rep: rep})
}

// loop runs events until every request is answered or refused; scrapes
// stop once nothing is left to do.
func (r *run) loop() {
	arrivals := len(r.w.Requests)
	for r.q.Len() > 0 {
		e := heap.Pop(&r.q).(event)
		r.now = e.at
		switch e.kind {
		case evArrival:
			arrivals--
			r.arrive(e.i)
		case evEnter:
			r.entering--
			r.enter(e.f)
		case evTokenized:
			r.entering--
			r.dispatch(e.f)
		case evKV:
			r.deliverKV(e.i)
		case evStep:
			r.step(e.i)
		case evScrape:
			r.scrapeServer(e.rep, e.i)
			if arrivals > 0 || len(r.flights)+r.queued+r.entering > 0 {
				r.pushScrape(e.rep, e.i)
			}
		}
		for i := range r.reps {
			r.admit(i)
		}
	}
	for _, rep := range r.reps {
		for _, f := range rep.waiting {
			f.ticket.Leave("timeout")
			r.res.Refused++
		}
		rep.waiting = nil
	}
	for i, d := range r.ttft {
		if d >= 0 {
			r.res.TTFT = append(r.res.TTFT, d)
			r.res.E2E = append(r.res.E2E, r.e2e[i])
		}
	}
	if len(r.w.Requests) > 0 {
		r.res.Duration = r.last
		if r.c.Clients <= 0 {
			r.res.Duration -= r.w.Requests[0].At
		}
	}
	for i, s := range r.servers {
		r.res.PerBackend[i] = s.served
		r.res.Preemptions += s.eng.Stats().Preemptions
	}
}

// scrapeServer renders server i's /metrics page from its engine's state
// and reads it with the real scrape code into replica rep's balancer.
func (r *run) scrapeServer(rep, i int) {
	s := r.servers[i]
	page := sim.RenderMetrics(r.c.Engine, Model, len(r.w.Adapters) > 0, s.eng.Stats(), r.clock())
	reading, err := r.scraper.Extract([]byte(page), r.clock())
	spec := balancer.Spec{ID: s.id, URL: s.url, Engine: r.c.Engine, Models: r.models, Adapters: r.adapts, State: balancer.StateReady}
	if err == nil {
		spec.Metrics = reading.Metrics
	} else {
		spec.Stale = true
	}
	r.reps[rep].bal.Update(spec)
}

func (r *run) arrive(i int) {
	rep := 0
	if len(r.reps) > 1 {
		rep = r.rng.IntN(len(r.reps))
	}
	req := &r.w.Requests[i]
	model := req.Model
	if model == "" {
		model = Model
	}
	f := &flight{req: req, idx: i, rep: rep, arrived: r.now}
	f.breq = balancer.Request{Model: model, Seed: prefix.Seed(model, ""), PromptTokens: r.c.Perturb.tokens(req.Tokens()), MaxTokens: req.MaxTokens,
		UserText: req.AppendUserText(nil, 100)}
	f.breq.FirstUser, f.breq.FirstTurn = req.FirstTurn()
	if r.kv != nil && r.reps[rep].bal.ReadsCacheEvents() {
		// Tokenized first, as the proxy asks /tokenize, then picked.
		r.text = req.AppendText(r.text[:0])
		f.tokens = sim.Tokens(r.text)
		bs := r.servers[0].eng.Config().BlockSize
		f.breq.TokenBlocks, f.breq.TokenBlockSize = kvevents.Blocks(nil, f.tokens, bs, req.Model), bs
		base, per := r.c.TokenizeBase, r.c.TokenizePerByte
		if base == 0 && per == 0 {
			base, per = 2*time.Millisecond, 80*time.Nanosecond
		}
		r.entering++
		r.push(event{at: r.now + base + time.Duration(len(r.text))*per, kind: evTokenized, f: f})
		return
	}
	r.dispatch(f)
}

// dispatch picks a server for f through its replica's balancer, the
// product's own admission queue included, and sends it there. It reports
// whether f left the queue (sent, refused or failed).
func (r *run) dispatch(f *flight) bool {
	rep := r.reps[f.rep]
	r.text = f.req.AppendText(r.text[:0])
	r.hashBlock = 0
	f.breq.Prompt = r.text
	f.breq.Guard = rep.bal.NewGuard()
	var dec balancer.Decision
	var err error
	if f.ticket == nil {
		dec, err = rep.bal.Pick(&f.breq, r.dst[:0])
		if errors.Is(err, balancer.ErrSaturated) {
			f.ticket, err = rep.bal.Enqueue(&f.breq)
			if err == nil {
				rep.waiting = append(rep.waiting, f)
				r.queued++
				return false
			}
		}
	} else {
		dec, err = f.ticket.Pick(r.dst[:0])
		if errors.Is(err, balancer.ErrSaturated) {
			return false
		}
	}
	r.dst = dec.Candidates
	switch {
	case errors.Is(err, balancer.ErrQueueFull), errors.Is(err, balancer.ErrShed):
		r.res.Refused++
		r.ended()
		return true
	case err != nil:
		r.res.Failed++
		r.ended()
		return true
	}
	f.srv = r.byID[dec.Candidates[0].ID]
	s := r.servers[f.srv]
	if r.c.Trace {
		r.tracePick(f, &dec)
	}
	f.seq = &sim.Seq{
		Hashes:       slices.Clone(r.engineHashes(f.breq.Model, s.block)),
		PromptTokens: f.req.Tokens(),
		MaxTokens:    f.req.MaxTokens,
	}
	if f.req.Model != "" {
		f.seq.Adapter = f.req.Model
	}
	f.seq.Tokens = f.tokens // the engine records KV events of what it has tokens of
	f.guard = f.breq.Guard
	f.breq.Prompt = nil // r.text is reused by the next request
	// The server's own per-request work (parsing, tokenising, scheduling)
	// comes before its scheduler sees the request.
	if d := s.eng.Config().Cost.Intake(f.seq.PromptTokens); d > 0 {
		r.entering++
		r.push(event{at: r.now + d, kind: evEnter, f: f})
	} else {
		r.enter(f)
	}
	return true
}

// enter hands a picked request to its server's scheduler.
func (r *run) enter(f *flight) {
	s := r.servers[f.srv]
	if err := s.eng.Add(f.seq); err != nil {
		f.guard.Release()
		r.res.Failed++
		r.ended()
		return
	}
	r.flights[f.seq] = f
	s.served++
	if !s.busy {
		r.step(f.srv)
	}
}

// admit moves replica rep's admission queue onto servers while they have
// room; heads that waited past the admission timeout leave, refused.
func (r *run) admit(rep int) {
	rp := r.reps[rep]
	timeout := rp.bal.Config().Admission.Timeout
	for len(rp.waiting) > 0 {
		f := rp.waiting[0]
		if r.now-f.arrived > timeout {
			f.ticket.Leave("timeout")
			r.res.Refused++
			rp.waiting = rp.waiting[1:]
			r.queued--
			r.ended()
			continue
		}
		if !r.dispatch(f) {
			return
		}
		rp.waiting = rp.waiting[1:]
		r.queued--
	}
}

// ended is called as each request leaves the cluster; in a closed-loop run
// its client sends the next request now.
func (r *run) ended() {
	if r.c.Clients > 0 && r.next < len(r.w.Requests) {
		r.push(event{at: r.now, kind: evArrival, i: r.next})
		r.next++
	}
}

// step ends server i's step in progress and starts the next.
func (r *run) step(i int) {
	s := r.servers[i]
	var d time.Duration
	r.out, d = s.eng.Step(r.out[:0])
	for _, o := range r.out {
		f := r.flights[o.Seq]
		if o.First {
			f.guard.FirstByte(r.clock())
			r.ttft[f.idx] = r.now - f.arrived
			r.traceFirst(f, r.ttft[f.idx], o.Seq.CachedTokens)
			r.res.PromptTokens += int64(o.Seq.PromptTokens)
			r.res.CachedTokens += int64(o.Seq.CachedTokens)
		}
		if o.Done {
			f.guard.Release()
			r.e2e[f.idx] = r.now - f.arrived
			r.res.OutputTokens += int64(o.Seq.Generated)
			r.last = max(r.last, r.now)
			delete(r.flights, o.Seq)
			r.ended()
		}
	}
	s.busy = d > 0
	if s.busy {
		r.push(event{at: r.now + d, kind: evStep, i: i})
	}
	if r.kv != nil {
		r.kvTake = s.eng.TakeKVEvents(r.kvTake[:0])
		if len(r.kvTake) > 0 {
			lag := r.c.KVEventLag
			if lag == 0 {
				lag = 2 * time.Millisecond
			}
			s.kv = append(s.kv, kvBatch{at: r.now + lag, events: slices.Clone(r.kvTake)})
			r.push(event{at: r.now + lag, kind: evKV, i: i})
		}
	}
}

// deliverKV enters server i's KV events that have reached the balancers.
func (r *run) deliverKV(i int) {
	s := r.servers[i]
	n := 0
	for ; n < len(s.kv) && s.kv[n].at <= r.now; n++ {
		// One step's events are one batch, as vLLM publishes them.
		// The hashes are gathered first, so that the one-hash slices the
		// events take of them do not move as the slice grows.
		evs := s.kv[n].events
		r.kvHashes = r.kvHashes[:0]
		for _, e := range evs {
			r.kvHashes = append(r.kvHashes, e.Hash)
		}
		b := kvevents.Batch{Events: r.kvEvents[:0], Rank: -1}
		for j, e := range evs {
			ke := kvevents.Event{Kind: kvevents.Removed, Hashes: r.kvHashes[j : j+1 : j+1]}
			if e.Stored {
				ke = kvevents.Event{Kind: kvevents.Stored, Hashes: ke.Hashes, Parent: e.Parent, HasParent: e.HasParent,
					Tokens: e.Tokens, BlockSize: len(e.Tokens), LoRA: e.Adapter}
			}
			b.Events = append(b.Events, ke)
		}
		r.kv.Apply(s.id, b)
		r.kvEvents = b.Events
	}
	s.kv = s.kv[n:]
}

// trueCache tells a balancer what each server's prefix cache really holds,
// for the presets that know it (llm-d's KV-event index, whose speculative
// indexing covers the events' delay for its own picks, and llmlb's scorer
// fed the truth).
type trueCache struct{ r *run }

func (o trueCache) CachedTokens(be *balancer.Backend, req *balancer.Request) int {
	i, ok := o.r.byID[be.ID]
	if !ok {
		return 0
	}
	s := o.r.servers[i]
	return s.eng.Holds(o.r.engineHashes(req.Model, s.block))
}

// engineHashes returns the engine block hashes of the request in r.text
// for blocks of block bytes, hashing once per request and block size.
func (r *run) engineHashes(model string, block int) []uint64 {
	if r.hashBlock != block {
		r.hashes = sim.BlockHashes(r.hashes[:0], xxhash.Sum64String(model), r.text, block)
		r.hashBlock = block
	}
	return r.hashes
}
