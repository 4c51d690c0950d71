package bench

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/llmlb/llmlb/balancer"
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
	// reads. (default "vllm")
	Engine string
	// Policy is the balancer policy, or "oracle".
	Policy string
	// Balancer is the base balancer configuration; Policy overrides its
	// policy. Zero means balancer.DefaultConfig().
	Balancer *balancer.Config
	// Prefix configures the prefix index (prefix.DefaultConfig() when
	// zero); the epp preset uses the endpoint picker's own sizes.
	Prefix *prefix.Config
	// ScrapeInterval is the time between scrapes of one server (default
	// 100ms, 50ms for epp, as `llmlb serve` does); each is jittered ±10%.
	ScrapeInterval time.Duration
	// Seed seeds the scrape jitter and the policies' randomness.
	Seed uint64
	// Clients, when positive, runs the workload closed-loop instead of at
	// its arrival times: that many clients each send the next request (in
	// arrival order, timestamps ignored) as soon as their previous one is
	// answered, refused or failed, as a benchmark client with a
	// concurrency limit does. The cluster then runs as fast as it can, so
	// the output tokens per second measure what routing lets it serve.
	Clients int
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
}

// event kinds
const (
	evArrival = iota
	evStep
	evScrape
)

type event struct {
	at   time.Duration
	kind int
	i    int    // request index or server index
	seq  uint64 // insertion order, to break ties deterministically
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
}

// flight is one request on its way through the cluster.
type flight struct {
	req     *Request
	idx     int
	guard   *balancer.Guard
	srv     int
	arrived time.Duration
	queued  bool // in the admission queue
}

// run is the state of one replay.
type run struct {
	c       Cluster
	w       *Workload
	bal     *balancer.Balancer
	scraper *scrape.Engine
	servers []*server
	byID    map[string]int
	q       events
	nseq    uint64
	now     time.Duration
	epoch   time.Time
	rng     *rand.Rand
	res     Result
	ttft    []time.Duration // by request index; -1 not served
	e2e     []time.Duration
	flights map[*sim.Seq]*flight
	waiting []*flight // the admission queue, oldest first
	text    []byte
	// hashes are the engine block hashes of text, for blocks of
	// hashBlock bytes (0: not computed for this request yet); the oracle
	// and the chosen server share them.
	hashes    []uint64
	hashBlock int
	dst       []*balancer.Backend
	out       []sim.Output
	models    []string
	adapts    []balancer.Adapter
	scrape    time.Duration
	last      time.Duration
	next      int // closed loop: the next request to send
}

// Run replays w through the cluster in virtual time and reports what
// happened. It is deterministic for the cluster's seed.
func Run(c Cluster, w *Workload) (Result, error) {
	res, _, err := runWith(c, w)
	return res, err
}

// runWith is Run that also returns the balancer, for tests.
func runWith(c Cluster, w *Workload) (Result, *balancer.Balancer, error) {
	if len(c.Presets) == 0 {
		return Result{}, nil, errors.New("bench: a cluster needs at least one server")
	}
	if c.Engine == "" {
		c.Engine = "vllm"
	}
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
	return r.res, r.bal, nil
}

func (r *run) clock() time.Time { return r.epoch.Add(r.now) }

func (r *run) build() error {
	bcfg := balancer.DefaultConfig()
	if r.c.Balancer != nil {
		bcfg = *r.c.Balancer
	}
	policy := r.c.Policy
	if policy == "" || policy == "default" {
		policy = bcfg.Policy
	}
	bcfg.Policy = policy
	pcfg := prefix.DefaultConfig()
	if r.c.Prefix != nil {
		pcfg = *r.c.Prefix
	}
	r.scrape = r.c.ScrapeInterval
	if policy == "epp" {
		pcfg = prefix.EPPConfig()
		if r.scrape == 0 {
			r.scrape = 50 * time.Millisecond
		}
	}
	if r.scrape == 0 {
		r.scrape = 100 * time.Millisecond
	}
	deps := balancer.Deps{
		Index: prefix.NewIndex(pcfg),
		Now:   r.clock,
		Rand:  r.rng.Uint64,
	}
	if policy == "sglang-cache-aware" {
		deps.Tree = prefix.NewTree(bcfg.SGLang.MaxTreeBytes)
	}
	if policy == "oracle" {
		deps.Oracle = oracle{r}
	} else if err := bcfg.Validate(); err != nil {
		return err
	}
	bal, err := balancer.New(bcfg, deps, nil, nil)
	if err != nil {
		return err
	}
	r.bal = bal
	for i, name := range r.c.Presets {
		cfg, err := sim.Preset(name)
		if err != nil {
			return err
		}
		id := fmt.Sprintf("sim-%02d-%s", i, name)
		u, _ := url.Parse("http://" + id + ":8000")
		eng := sim.NewEngine(cfg)
		r.servers = append(r.servers, &server{id: id, url: u, eng: eng, block: eng.Config().BlockSize * sim.BytesPerToken})
		r.byID[id] = i
		// Every server is scraped once before traffic, as discovery
		// does, then on its jittered interval.
		r.scrapeServer(i)
		r.push(r.jitter(), evScrape, i)
	}
	if r.c.Clients > 0 {
		r.next = min(r.c.Clients, len(r.w.Requests))
		for i := range r.next {
			r.push(0, evArrival, i)
		}
	} else {
		for i := range r.w.Requests {
			r.push(r.w.Requests[i].At, evArrival, i)
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

func (r *run) push(at time.Duration, kind, i int) {
	r.nseq++
	heap.Push(&r.q, event{at: at, kind: kind, i: i, seq: r.nseq})
}

func (r *run) jitter() time.Duration {
	j := 0.9 + 0.2*r.rng.Float64()
	return time.Duration(float64(r.scrape) * j)
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
		case evStep:
			r.step(e.i)
		case evScrape:
			r.scrapeServer(e.i)
			if arrivals > 0 || len(r.flights) > 0 || len(r.waiting) > 0 {
				r.push(r.now+r.jitter(), evScrape, e.i)
			}
		}
		r.admit()
	}
	for range r.waiting {
		r.res.Refused++
	}
	r.waiting = nil
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

// scrapeServer renders the server's /metrics page from its engine's state
// and reads it with the real scrape code into the balancer.
func (r *run) scrapeServer(i int) {
	s := r.servers[i]
	page := sim.RenderMetrics(r.c.Engine, Model, len(r.w.Adapters) > 0, s.eng.Stats(), r.clock())
	reading, err := r.scraper.Extract([]byte(page), r.clock())
	spec := balancer.Spec{ID: s.id, URL: s.url, Engine: r.c.Engine, Models: r.models, Adapters: r.adapts, State: balancer.StateReady}
	if err == nil {
		spec.Metrics = reading.Metrics
	} else {
		spec.Stale = true
	}
	r.bal.Update(spec)
}

func (r *run) arrive(i int) {
	r.dispatch(&flight{req: &r.w.Requests[i], idx: i, arrived: r.now})
}

// dispatch picks a server for f and hands it over; a saturated cluster
// queues it as the proxy's admission queue would. It reports whether f
// left the queue (served, refused or failed).
func (r *run) dispatch(f *flight) bool {
	req := f.req
	model := req.Model
	if model == "" {
		model = Model
	}
	r.text = req.AppendText(r.text[:0])
	r.hashBlock = 0
	guard := r.bal.NewGuard()
	breq := balancer.Request{Model: model, Prompt: r.text, Seed: prefix.Seed(model, ""), PromptTokens: req.Tokens(), MaxTokens: req.MaxTokens, Guard: guard}
	dec, err := r.bal.Pick(&breq, r.dst[:0])
	r.dst = dec.Candidates
	switch {
	case errors.Is(err, balancer.ErrSaturated):
		if !f.queued { // first try: join the queue
			if len(r.waiting) >= r.bal.Config().Admission.MaxQueue {
				r.res.Refused++
				r.ended()
				return true
			}
			f.queued = true
			r.waiting = append(r.waiting, f)
		}
		return false
	case err != nil:
		r.res.Failed++
		r.ended()
		return true
	}
	si := r.byID[dec.Candidates[0].ID]
	s := r.servers[si]
	seq := &sim.Seq{
		Hashes:       slices.Clone(r.engineHashes(model, s.block)),
		PromptTokens: req.Tokens(),
		MaxTokens:    req.MaxTokens,
	}
	if req.Model != "" {
		seq.Adapter = req.Model
	}
	if err := s.eng.Add(seq); err != nil {
		guard.Release()
		r.res.Failed++
		r.ended()
		return true
	}
	f.guard, f.srv = guard, si
	r.flights[seq] = f
	s.served++
	if !s.busy {
		r.step(si)
	}
	return true
}

// admit moves the admission queue's head onto servers while they have
// room; heads that waited past the admission timeout are refused.
func (r *run) admit() {
	timeout := r.bal.Config().Admission.Timeout
	for len(r.waiting) > 0 {
		f := r.waiting[0]
		if r.now-f.arrived > timeout {
			r.res.Refused++
			r.waiting = r.waiting[1:]
			r.ended()
			continue
		}
		if !r.dispatch(f) {
			return
		}
		r.waiting = r.waiting[1:]
	}
}

// ended is called as each request leaves the cluster; in a closed-loop run
// its client sends the next request now.
func (r *run) ended() {
	if r.c.Clients > 0 && r.next < len(r.w.Requests) {
		r.push(r.now, evArrival, r.next)
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
		r.push(r.now+d, evStep, i)
	}
}

// oracle knows what each server's prefix cache really holds.
type oracle struct{ r *run }

func (o oracle) CachedTokens(be *balancer.Backend, req *balancer.Request) int {
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
