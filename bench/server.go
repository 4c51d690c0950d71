package bench

import (
	"net/url"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/sim"
)

// server is one emulated engine in the cluster.
type server struct {
	id          string
	url         *url.URL
	eng         engine
	blockTokens int      // tokens a KV block holds
	block       int      // bytes a KV block holds
	intake      sim.Cost // prices the server's work before its scheduler sees a request
	// eager: the engine starts a request the moment it is added, not at
	// its next step (sim.LLMDSim), so it is stepped after every Add.
	eager  bool
	role   balancer.Role
	busy   bool   // a step is scheduled
	gen    uint64 // the scheduled step's: a step event of another is stale
	served int
	kv     []kvBatch // KV events on their way to the balancers, oldest first
	last   scraped   // the server's last scrape, by any replica
}

// scraped is a server's scrape: the stats its page was rendered from and
// what the scraper read of it. Without adapters a page is a function of
// the stats alone, so a scrape that finds them unchanged (an idle server,
// or another replica's scrape a moment before) takes that reading rather
// than rendering and parsing the same page again.
type scraped struct {
	ok      bool
	st      sim.Stats
	metrics balancer.Metrics
	err     error
}

// kvBatch is one step's KV events and when they reach the balancers.
type kvBatch struct {
	at     time.Duration
	events []sim.KVEvent
}

// step ends server i's step in progress and starts the next.
func (r *run) step(i int) {
	s := r.servers[i]
	var d time.Duration
	r.out, d = s.eng.Step(r.out[:0])
	for _, o := range r.out {
		f := r.flights[o.Seq]
		if o.Refused {
			r.refused(f, o.Seq)
			continue
		}
		if f.pd != nil && o.Seq == f.pd.seq {
			r.prefilled(f, o)
			continue
		}
		if o.First {
			f.guard.FirstByte(r.clock())
			r.ttft[f.idx] = r.now - f.arrived
			r.traceFirst(f, r.ttft[f.idx], o.Seq.CachedTokens)
			if obs := (r.now - f.pickedAt).Seconds(); f.estimate > 0 && f.pd == nil && obs > 0 {
				r.res.EstimateRatios = append(r.res.EstimateRatios, f.estimate/obs)
			}
			if f.pd == nil { // a prefill leg counted its own
				r.res.PromptTokens += int64(o.Seq.PromptTokens)
				r.res.CachedTokens += int64(o.Seq.CachedTokens)
			}
		}
		if o.Done {
			f.guard.Usage(balancer.Usage{PromptTokens: o.Seq.PromptTokens, CachedTokens: o.Seq.CachedTokens, CachedKnown: true})
			f.guard.Release()
			r.e2e[f.idx] = r.now - f.arrived
			if n := o.Seq.Generated; n > 1 {
				r.tpot[f.idx] = (r.e2e[f.idx] - r.ttft[f.idx]) / time.Duration(n-1)
				r.res.TPOT = append(r.res.TPOT, r.tpot[f.idx])
			}
			r.res.OutputTokens += int64(o.Seq.Generated)
			r.last = max(r.last, r.now)
			delete(r.flights, o.Seq)
			r.answeredBy[f.idx] = f.srv
			r.ended(f.idx, true)
		}
	}
	s.busy = d > 0
	s.gen++
	if s.busy {
		r.push(event{at: r.now + d, kind: evStep, i: i, gen: s.gen})
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

// scrapeServer renders server i's /metrics page from its engine's state
// and reads it with the real scrape code into replica rep's balancer.
func (r *run) scrapeServer(rep, i int) {
	s := r.servers[i]
	st, lora := s.eng.Stats(), len(r.w.Adapters) > 0
	if lora || !s.last.ok || !sameStats(&st, &s.last.st) {
		page := sim.RenderMetrics(r.c.Engine, Model, lora, st, r.clock())
		reading, err := r.scraper.Extract([]byte(page), r.clock())
		s.last = scraped{ok: true, st: st, metrics: reading.Metrics, err: err}
	}
	spec := balancer.Spec{ID: s.id, URL: s.url, Engine: r.c.Engine, Models: r.models, Adapters: r.adapts, State: balancer.StateReady, Role: s.role}
	if s.last.err == nil {
		spec.Metrics = s.last.metrics
		spec.Metrics.At = r.clock()
	} else {
		spec.Stale = true
	}
	r.reps[rep].bal.Update(spec)
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

// trueCache tells a balancer what each server's prefix cache really holds
// of the prompt the balancer sees, for the presets that know it (llm-d's
// KV-event index, whose speculative indexing covers the events' delay for
// its own picks, and llmlb's scorer fed the truth). A peer picking a stored
// follow-up sees only its new input, and is told what the servers hold of
// that as a prompt of its own.
type trueCache struct{ r *run }

func (o trueCache) CachedTokens(be *balancer.Backend, req *balancer.Request) int {
	r := o.r
	i, ok := r.byID[be.ID]
	if !ok {
		return 0
	}
	s := r.servers[i]
	if r.newOnly {
		r.newHashes = sim.BlockHashes(r.newHashes[:0], xxhash.Sum64String(req.Model), r.newText, s.block)
		return s.eng.Holds(r.newHashes)
	}
	return s.eng.Holds(r.engineHashes(req.Model, s.block))
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

// sameStats reports whether a and b render the same page.
func sameStats(a, b *sim.Stats) bool {
	return a.Waiting == b.Waiting && a.Running == b.Running && a.KVUsage == b.KVUsage &&
		a.BlockSize == b.BlockSize && a.NumBlocks == b.NumBlocks && a.PromptTokens == b.PromptTokens &&
		a.GenerationTokens == b.GenerationTokens && a.PrefixQueries == b.PrefixQueries &&
		a.PrefixHits == b.PrefixHits && a.Preemptions == b.Preemptions && a.CachedBlocks == b.CachedBlocks &&
		a.MaxLoRA == b.MaxLoRA && slices.Equal(a.RunningAdapters, b.RunningAdapters) &&
		slices.Equal(a.WaitingAdapters, b.WaitingAdapters)
}
