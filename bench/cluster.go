package bench

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// Model is the base model the emulated cluster serves.
const Model = "llama-3.1-8b"

// Cluster describes the emulated servers and the balancer in front of them.
type Cluster struct {
	// Pinned sends each request whose trace names its backend
	// ([Request.Backend]) to the server standing for it: the backends, in
	// the order of their names, are servers 0, 1, ... (wrapping around
	// the servers); the rest are picked. It also keeps each request's
	// own figures ([Result.ByRequest]). For calibrating the engine model
	// against a capture: the same request on the same server.
	Pinned bool
	// GiveUp, when its TTFT is set, ends the run early ([Result.GaveUp])
	// once Late requests have taken longer than TTFT to their first token
	// or were not served: `llmlb plan`'s runs of too few servers need not
	// play out.
	GiveUp GiveUp
	// Presets names each server's engine preset (sim.Preset), one entry a
	// server; with EngineModel llm-d-sim, each is "llm-d-sim".
	Presets []string
	// EngineModel is how the servers schedule and cache: vllm-v1 or
	// llm-d-sim ([EngineModels]). (default vllm-v1)
	EngineModel string
	// Engine is the /metrics flavour the servers render and the scraper
	// reads; "sglang" servers also take a prefix into their cache only
	// once it is computed (sim.EngineConfig.CacheOnCompute). (default
	// "vllm")
	Engine string
	// Policy is the balancer policy: a preset name (balancer.Presets),
	// "default", or the default with rules off ([AblatedPrefix]).
	Policy string
	// Balancer is the base balancer configuration; Policy overrides its
	// policy. Zero means balancer.DefaultConfig().
	Balancer *balancer.Config
	// Prefix configures the prefix index (prefix.DefaultConfig() when
	// zero); the epp preset uses the endpoint picker's own sizes.
	Prefix *prefix.Config
	// ScrapeInterval is the time between scrapes of one server (default:
	// the preset's, else scrape.interval's, as `llmlb serve` does); each is jittered
	// ±10%.
	ScrapeInterval time.Duration
	// Replicas is how many independent balancers run side by side, each
	// with its own index, ledger, admission queue and scrapes of every
	// server; each arrival goes to one at random, as a Kubernetes Service
	// spreads connections. (default 1)
	Replicas int
	// SharedLedger, when positive with several replicas, has them share
	// their ledgers as replicas sharing state through Redis do (issue 55):
	// every SharedLedger of virtual time each replica's own load on each
	// server ([balancer.Ledger.Own]) is read, and every replica's ledger
	// for that server is told the sum of the others'
	// ([balancer.Ledger.SetPeers]), which its picks count until the next
	// tick, so a replica's view of the others is up to one interval old.
	// Zero is no sharing: each replica knows only its own work.
	SharedLedger time.Duration
	// SLO, when either target is set, counts the served requests that met
	// both ([Result.Met]): their first token within SLO.TTFT of their
	// arrival, each later one within SLO.TPOT of the one before, on
	// average.
	SLO SLO
	// HideTargets: the balancer is told neither the requests' priorities
	// nor their deadlines ([Request.Priority], [Request.SLO]), though they
	// are still judged by their targets, to measure what acting on them
	// earns.
	HideTargets bool
	// Seed seeds the scrape jitter and the policies' randomness.
	Seed uint64
	// Perturb scales the engines' real costs without telling the
	// balancer, to see how a policy degrades when its model of the engine
	// is wrong ([Perturb.applyLLMD] for llm-d-sim). Zero is no change.
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
	// concurrency limit does; a client that sends a session's first turn
	// stays with the session to its end. The cluster then runs as fast as it can, so
	// the output tokens per second measure what routing lets it serve.
	Clients int
	// Trace records each served request's pick in [Result.Trace]: the
	// caches and prefill work the servers held then ([TraceRecord]).
	Trace bool
	// Roles gives each server its part in a disaggregated prefill/decode
	// fleet, one entry a server (nil: all both). With a prefill or decode
	// server, requests are split into two legs as llmlb's proxy splits
	// them, by the balancer's PD config ([pdLeg]).
	Roles []balancer.Role
	// Transfer prices a split request's KV transfer (zero: sim.PDConfig's
	// defaults).
	Transfer sim.PDConfig
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
	// TPOT is each served request's time per output token after the
	// first, for those of two tokens or more, in completion order.
	TPOT []time.Duration
	// Split counts the requests that took a prefill leg on another
	// server ([Cluster.Roles]).
	Split int
	// FollowUps counts the stored follow-ups sent ([Request.Stored]), and
	// FailedFollowUps those that reached a server other than the one
	// storing the response they continue, which answers 404 at once;
	// they are in neither Refused nor Failed. Unsent counts the later
	// turns never sent because an earlier turn of their session was not
	// answered.
	FollowUps, FailedFollowUps, Unsent int
	// Trace holds one record a served request, in first-token order,
	// when the run was traced ([Cluster.Trace]).
	Trace []TraceRecord
	// SLO is the cluster's ([Cluster.SLO]), and Met counts the served
	// requests that met it, or in a workload whose requests carry their
	// own targets (OwnTargets, [Workload.OwnTargets]) those that met
	// their own, a request without any meeting them if served. Targeted
	// counts the requests sent that carry targets of their own, and
	// TargetedMet those of them that met them.
	SLO                   SLO
	Met                   int
	OwnTargets            bool
	Targeted, TargetedMet int
	// EstimateRatios are, for each request of one leg whose pick
	// estimated its time to first token (the default policy's), that
	// estimate over the time the first token took from the pick, in
	// first-token order.
	EstimateRatios []float64
	// ByRequest holds each request's time to first token and per output
	// token, by its index in the workload, in a pinned run
	// ([Cluster.Pinned]); -1 for a request not served (a TPOT of 0 for
	// one of a token).
	ByRequest []RequestTimes
	// GaveUp: the run stopped early ([Cluster.GiveUp]); its figures are
	// of the requests answered until then.
	GaveUp bool
}

// RequestTimes is one request's time to its first token and per output
// token after it.
type RequestTimes struct{ TTFT, TPOT time.Duration }

// GiveUp is when a run may stop: Late requests over TTFT.
type GiveUp struct {
	TTFT time.Duration
	Late int
}

// SLO is a request's latency targets: to its first token from its
// arrival, and per later token; 0 is none.
type SLO struct{ TTFT, TPOT time.Duration }

func (s SLO) set() bool { return s.TTFT > 0 || s.TPOT > 0 }

// met reports whether a served request's time to first token and time per
// later token meet s; every time meets the zero SLO.
func (s SLO) met(ttft, tpot time.Duration) bool {
	return (s.TTFT == 0 || ttft <= s.TTFT) && (s.TPOT == 0 || tpot <= s.TPOT)
}

// judged reports whether the run's requests were judged against targets:
// the run's, or their own.
func (r *Result) judged() bool { return r.SLO.set() || r.OwnTargets }

// replica is one balancer in front of every server.
type replica struct {
	bal     *balancer.Balancer
	scrape  time.Duration
	waiting []*flight // in its admission queue, oldest first
	// ledgers are its balancer's ledgers, by server index, for the shared
	// ledger's ticks ([Cluster.SharedLedger]); nil without sharing.
	ledgers []*balancer.Ledger
	own     []balancer.Load // by server index: its own load at the last tick
}

// run is the state of one replay.
type run struct {
	pinned   map[string]string // a trace's backend -> the ID of the server standing for it
	late     int               // of the requests scanned, those late by c.GiveUp.TTFT
	scanned  int               // requests whose first token's deadline has passed
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
	tpot     []time.Duration // by request index: time per output token after the first; 0 for one token
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
	// pending counts the arrivals still to come, for the scrapes to stop.
	pending int
	// after and before are the indexes of each request's session's next
	// and previous turns, -1 for none; answeredBy is the server that
	// answered each request, -1 until one has.
	after, before, answeredBy []int
	// roles: some server is not of role both, so requests may split.
	roles bool
	// followsStored: the policy is llmlb's own, whose proxy sends a
	// stored follow-up to the server storing its previous response
	// ([balancer.Preset.FollowsStored]).
	followsStored bool
	newText       []byte // a stored follow-up's body text, for a peer's pick
	// newOnly: the pick in progress sees only newText, so the true cache
	// is asked about it alone.
	newOnly   bool
	newHashes []uint64
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
	r, err := newRun(c, w)
	if err != nil {
		return Result{}, nil, err
	}
	r.loop()
	var bals []*balancer.Balancer
	for _, rep := range r.reps {
		bals = append(bals, rep.bal)
	}
	return r.res, bals, nil
}

// newRun checks c and builds the run of w through it, its first events
// queued.
func newRun(c Cluster, w *Workload) (*run, error) {
	if len(c.Presets) == 0 {
		return nil, errors.New("bench: a cluster needs at least one server")
	}
	if err := checkEngineModel(c.EngineModel); err != nil {
		return nil, err
	}
	if c.Engine == "" {
		c.Engine = "vllm"
	}
	c.Replicas = max(1, c.Replicas)
	if c.KVEvents && c.Perturb.tokenizer() != sim.BytesPerToken {
		return nil, fmt.Errorf("bench: --kv-events takes the engines' tokenizer at %d bytes a token, not %g", sim.BytesPerToken, c.Perturb.tokenizer())
	}
	if c.EngineModel == LLMDSim && c.Perturb.Tokenizer == 0 && !c.KVEvents {
		c.Perturb.Tokenizer = LLMDSimTokenizer
	}
	engines, err := scrape.NewEngineSet(nil)
	if err != nil {
		return nil, err
	}
	scraper := engines[c.Engine]
	if scraper == nil {
		return nil, fmt.Errorf("bench: unknown engine %q", c.Engine)
	}
	r := &run{c: c, w: w, scraper: scraper, byID: map[string]int{}, flights: map[*sim.Seq]*flight{},
		epoch: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), rng: rand.New(rand.NewPCG(c.Seed, 0xbe7c4))}
	r.res.Policy = c.Policy
	r.models = append([]string{Model}, w.Adapters...)
	for _, a := range w.Adapters {
		r.adapts = append(r.adapts, balancer.Adapter{Name: a, Parent: Model})
	}
	if err := r.build(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *run) clock() time.Time { return r.epoch.Add(r.now) }

func (r *run) build() error {
	bcfg := balancer.DefaultConfig()
	if r.c.Balancer != nil {
		bcfg = *r.c.Balancer
	}
	if off, ok, err := ablated(r.c.Policy); ok {
		if err != nil {
			return err
		}
		bcfg = bcfg.Without(off)
	} else if r.c.Policy != "" && r.c.Policy != DefaultPolicy {
		bcfg.Policy = r.c.Policy
	}
	// Replicas place new prompts by a hash they compute alike, as `llmlb
	// serve` does with cluster.stateless_replicas or Redis.
	bcfg.TTFT.Replicated = r.c.Replicas > 1
	pr, err := balancer.LookupPreset(bcfg.Policy)
	if err != nil {
		return err
	}
	if err := bcfg.Validate(); err != nil && !pr.TrueCache && !pr.BenchOnly && !pr.Unlisted {
		return err
	}
	r.followsStored = pr.FollowsStored
	pcfg := prefix.DefaultConfig()
	if r.c.Prefix != nil {
		pcfg = *r.c.Prefix
	}
	interval := pr.ScrapeEvery(cmp.Or(r.c.ScrapeInterval, scrape.DefaultConfig().Interval), r.c.ScrapeInterval != 0)
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
		bal, _, err := balancer.Build(bcfg, pcfg, deps, nil, nil)
		if err != nil {
			return err
		}
		r.reps = append(r.reps, &replica{bal: bal, scrape: interval})
	}
	for i, name := range r.c.Presets {
		id := fmt.Sprintf("sim-%02d-%s", i, name)
		u, _ := url.Parse("http://" + id + ":8000")
		srv := &server{id: id, url: u}
		if err := r.newEngine(srv, name); err != nil {
			return err
		}
		if i < len(r.c.Roles) {
			srv.role = r.c.Roles[i]
			r.roles = r.roles || srv.role != balancer.RoleBoth
		}
		r.servers = append(r.servers, srv)
		r.byID[id] = i
		// Every replica scrapes every server once before traffic, as
		// discovery does, then on its own jittered interval.
		for rep := range r.reps {
			r.scrapeServer(rep, i)
			r.pushScrape(rep, i)
		}
	}
	if r.c.SharedLedger > 0 && len(r.reps) > 1 {
		for _, rep := range r.reps {
			for _, s := range r.servers {
				rep.ledgers = append(rep.ledgers, rep.bal.Ledger(s.id))
			}
			rep.own = make([]balancer.Load, len(r.servers))
		}
		r.push(event{at: r.c.SharedLedger, kind: evShare})
	}
	if err := r.linkTurns(); err != nil {
		return err
	}
	r.pending = len(r.w.Requests)
	if r.c.Clients > 0 {
		for range r.c.Clients {
			if !r.sendNext() {
				break
			}
		}
	} else {
		for i := range r.w.Requests {
			if r.w.Requests[i].Turn == 0 { // later turns wait for their answers
				r.push(event{at: r.w.Requests[i].At, kind: evArrival, i: i})
			}
		}
	}
	r.ttft = make([]time.Duration, len(r.w.Requests))
	r.e2e = make([]time.Duration, len(r.w.Requests))
	r.tpot = make([]time.Duration, len(r.w.Requests))
	for i := range r.ttft {
		r.ttft[i], r.e2e[i] = -1, -1
	}
	r.res.PerBackend = make([]int, len(r.servers))
	if r.c.Pinned {
		var names []string
		for i := range r.w.Requests {
			if b := r.w.Requests[i].Backend; b != "" && !slices.Contains(names, b) {
				names = append(names, b)
			}
		}
		slices.Sort(names)
		r.pinned = make(map[string]string, len(names))
		for i, b := range names {
			r.pinned[b] = r.servers[i%len(r.servers)].id
		}
	}
	return nil
}

// linkTurns finds each session's next turn after every request; a later
// turn without the one before it is an error.
func (r *run) linkTurns() error {
	n := len(r.w.Requests)
	r.after, r.before, r.answeredBy = make([]int, n), make([]int, n), make([]int, n)
	type turn struct {
		session uint64
		n       int
	}
	idx := map[turn]int{}
	for i := range r.w.Requests {
		r.after[i], r.before[i], r.answeredBy[i] = -1, -1, -1
		if q := &r.w.Requests[i]; q.Session != 0 {
			idx[turn{q.Session, q.Turn}] = i
		}
	}
	for i := range r.w.Requests {
		q := &r.w.Requests[i]
		if q.Turn == 0 {
			if q.Stored > 0 {
				return fmt.Errorf("bench: request %d continues a stored response but is its session's first turn", i)
			}
			continue
		}
		prev, ok := idx[turn{q.Session, q.Turn - 1}]
		if q.Session == 0 || !ok {
			return fmt.Errorf("bench: request %d is turn %d of session %d, which has no turn %d", i, q.Turn, q.Session, q.Turn-1)
		}
		r.after[prev], r.before[i] = i, prev
	}
	return nil
}
