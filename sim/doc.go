// Package sim emulates LLM model servers so llmlb can be run, tested and
// shown on machines with no GPU: an engine model after vLLM V1 (continuous
// batching with chunked prefill, a paged KV cache with prefix caching,
// preemption, LoRA, a step-cost model held to published measurements by
// its calibration), driven in real time behind the OpenAI completions, chat
// and Responses APIs, Anthropic's Messages API, /v1/models, /health and
// each engine's /metrics, or in virtual time by package bench; and a second
// engine model of another form, after llm-d's inference simulator
// ([LLMDSim]: each request on timers of its own, no batching, a request
// whose KV blocks do not fit refused), which bench runs in virtual time.
package sim
