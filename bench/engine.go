package bench

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/llmlb/llmlb/sim"
)

// Engine models: how an emulated server schedules and caches, whatever
// its preset's constants.
const (
	// VLLMV1 is sim.Engine: vLLM V1's continuous batching with chunked
	// prefill, prefix caching and preemption. The default.
	VLLMV1 = "vllm-v1"
	// LLMDSim is sim.LLMDSim, after llm-d's inference simulator: each
	// request on its own timers, prefill at a cost a token, decode slowing
	// with the requests running, a request whose KV blocks do not fit
	// refused.
	LLMDSim = "llm-d-sim"
)

// LLMDSimTokenizer is the bytes of the workloads' text a token of
// llm-d-sim's engines reads unless --perturb tokenizer says otherwise: what
// llm-d's inference simulator's tokenizer gives on the bench's text, about
// 6.6 (issue 46 measured it against the simulator over HTTP). With KV-cache
// events, whose tokens are 4 bytes, it is 4.
const LLMDSimTokenizer = 6.6

// EngineModels lists the engine models, the default first.
func EngineModels() []string { return []string{VLLMV1, LLMDSim} }

// checkEngineModel returns an error for a model name EngineModels does
// not list; "" is the default.
func checkEngineModel(name string) error {
	if name != "" && !slices.Contains(EngineModels(), name) {
		return fmt.Errorf("bench: unknown engine model %q (have %v)", name, EngineModels())
	}
	return nil
}

// engine is an emulated server's scheduler and KV cache as the cluster
// drives it in virtual time. Step ends what is due and returns how long
// until the engine next needs a Step (0: not until an Add).
type engine interface {
	Add(s *sim.Seq) error
	Step(out []sim.Output) ([]sim.Output, time.Duration)
	Holds(hashes []uint64) int
	PrefillLeft() int
	Stats() sim.Stats
	TakeKVEvents(dst []sim.KVEvent) []sim.KVEvent
	Receive(hashes []uint64)
}

var (
	_ engine = (*sim.Engine)(nil)
	_ engine = (*sim.LLMDSim)(nil)
)

// newEngine builds server i's engine for the cluster's engine model and
// fills in what the cluster needs to know of it on srv: its KV block size,
// its intake cost, and whether it starts a request the moment it is added.
func (r *run) newEngine(srv *server, preset string) error {
	switch r.c.EngineModel {
	case "", VLLMV1:
		cfg, err := sim.Preset(preset)
		if err != nil {
			return err
		}
		cfg.Cost = r.c.Perturb.apply(cfg.Cost)
		cfg.CacheOnCompute = sim.CachesOnCompute(r.c.Engine)
		cfg.KVEvents = r.c.KVEvents
		eng := sim.NewEngine(cfg)
		srv.eng, srv.intake, srv.blockTokens = eng, eng.Config().Cost, eng.Config().BlockSize
	case LLMDSim:
		if preset != LLMDSim {
			return fmt.Errorf("bench: engine model %s has no preset %q", LLMDSim, preset)
		}
		cfg := r.c.Perturb.applyLLMD(sim.DefaultLLMDSimConfig())
		cfg.KVEvents = r.c.KVEvents
		eng := sim.NewLLMDSim(cfg, func() time.Duration { return r.now })
		srv.eng, srv.blockTokens, srv.eager = eng, eng.Config().BlockSize, true
	default:
		return checkEngineModel(r.c.EngineModel)
	}
	srv.block = int(math.Round(float64(srv.blockTokens) * r.c.Perturb.tokenizer()))
	return nil
}
