package sim

import (
	"fmt"
	"strings"
	"time"
)

// RenderMetrics writes the Prometheus page engine would serve for a server
// of model in state st, with each engine's own names, labels and units:
//
//   - vllm: the V1 engine's gauges labelled engine and model_name,
//     vllm:cache_config_info{block_size,num_gpu_blocks}, and, when the server
//     has adapters, vllm:lora_requests_info valued with the update time.
//   - sglang: sglang:num_queue_reqs, num_running_reqs, token_usage (a 0..1
//     fraction) and cache_config_info{page_size,num_pages}.
//   - triton-tensorrt-llm: the TensorRT-LLM backend's nv_trt_llm_* families
//     keyed by request_type and kv_cache_block_type.
//   - trtllm-serve: trtllm_* gauges labelled engine_type and model_name.
//
// Each page also carries a histogram, so readers are tested against the
// _bucket, _sum and _count lines real pages have.
func RenderMetrics(engine, model string, lora bool, st Stats, now time.Time) string {
	var b strings.Builder
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	sample := func(name, labels string, v float64) {
		fmt.Fprintf(&b, "%s{%s} %s\n", name, labels, formatFloat(v))
	}
	// one writes a family that has a single series.
	one := func(name, typ, help, labels string, v float64) {
		family(name, typ, help)
		sample(name, labels, v)
	}
	histogram := func(name, labels string, count int64) {
		family(name, "histogram", "Histogram of time to first token in seconds.")
		histogramSamples(&b, name, labels, count)
	}
	switch engine {
	case "sglang":
		l := fmt.Sprintf("model_name=%q", model)
		one("sglang:num_running_reqs", "gauge", "The number of running requests", l, float64(st.Running))
		one("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue", l, float64(st.Waiting))
		one("sglang:token_usage", "gauge", "The token usage", l, st.KVUsage)
		one("sglang:num_used_tokens", "gauge", "The number of used tokens", l, st.KVUsage*float64(st.BlockSize*st.NumBlocks))
		one("sglang:cache_config_info", "gauge", "Information of the cache config", fmt.Sprintf("%s,num_pages=\"%d\",page_size=\"%d\"", l, st.NumBlocks, st.BlockSize), 1)
		one("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", l, float64(st.PromptTokens))
		one("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", l, float64(st.GenerationTokens))
		histogram("sglang:time_to_first_token_seconds", l, st.GenerationTokens)
	case "triton-tensorrt-llm":
		const l = `model="tensorrt_llm",version="1"`
		family("nv_trt_llm_request_metrics", "gauge", "TRT LLM request metrics")
		sample("nv_trt_llm_request_metrics", l+`,request_type="waiting"`, float64(st.Waiting))
		sample("nv_trt_llm_request_metrics", l+`,request_type="context"`, 0)
		sample("nv_trt_llm_request_metrics", l+`,request_type="scheduled"`, float64(st.Running))
		sample("nv_trt_llm_request_metrics", l+`,request_type="max"`, 256)
		sample("nv_trt_llm_request_metrics", l+`,request_type="active"`, float64(st.Running+st.Waiting))
		used := st.KVUsage * float64(st.NumBlocks)
		family("nv_trt_llm_kv_cache_block_metrics", "gauge", "TRT LLM KV cache block metrics")
		sample("nv_trt_llm_kv_cache_block_metrics", l+`,kv_cache_block_type="fraction"`, st.KVUsage)
		sample("nv_trt_llm_kv_cache_block_metrics", l+`,kv_cache_block_type="tokens_per"`, float64(st.BlockSize))
		sample("nv_trt_llm_kv_cache_block_metrics", l+`,kv_cache_block_type="used"`, used)
		sample("nv_trt_llm_kv_cache_block_metrics", l+`,kv_cache_block_type="free"`, float64(st.NumBlocks)-used)
		sample("nv_trt_llm_kv_cache_block_metrics", l+`,kv_cache_block_type="max"`, float64(st.NumBlocks))
		one("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model.", l, float64(st.Waiting))
		histogram("nv_inference_first_response_histogram_ms", l, st.GenerationTokens)
	case "trtllm-serve":
		l := fmt.Sprintf("engine_type=\"pytorch\",model_name=%q", model)
		one("trtllm_num_requests_running", "gauge", "Number of active requests", l, float64(st.Running))
		one("trtllm_num_requests_waiting", "gauge", "Number of queued requests", l, float64(st.Waiting))
		one("trtllm_kv_cache_utilization", "gauge", "KV cache utilization", l, st.KVUsage)
		one("trtllm_kv_cache_tokens_per_block", "gauge", "Tokens per KV cache block", l, float64(st.BlockSize))
		one("trtllm_kv_cache_max_blocks", "gauge", "Maximum number of KV cache blocks", l, float64(st.NumBlocks))
		one("trtllm_prompt_tokens_total", "counter", "Cumulative number of prompt (input) tokens processed.", l, float64(st.PromptTokens))
		histogram("trtllm_time_to_first_token_seconds", l, st.GenerationTokens)
	default: // vllm
		writeVLLMPage(&b, model, lora, 0, []Stats{st}, now)
	}
	return b.String()
}

// RenderRankMetrics writes the page of a server of data-parallel ranks,
// sts[i] being rank start+i, labelled as the engine labels its ranks:
//
//   - vllm: each family once, with one series per rank labelled
//     engine="<global rank>", as vLLM's PrometheusStatLogger labels them
//     (vllm/v1/metrics/loggers.py at a6f0308c).
//   - sglang: the scheduler's gauges with one series per rank labelled
//     model_name, engine_type="unified", tp_rank="0", pp_rank="0" and
//     dp_rank="<rank>", as SGLang's init_metrics labels a data-parallel
//     scheduler (python/sglang/srt/managers/scheduler_metrics_mixin.py at
//     01bb3c80); cache_config_info per rank with the same labels (the
//     emulation's choice: its labels in SGLang were not checked); the
//     token counters and the histogram, which its one tokenizer process
//     keeps, once for the server, labelled model_name.
//
// Other engines are rendered as vllm; [NewDataParallelServer] refuses
// them ranks.
func RenderRankMetrics(engine, model string, lora bool, start int, sts []Stats, now time.Time) string {
	var b strings.Builder
	if engine == "sglang" {
		writeSGLangRankPage(&b, model, start, sts)
	} else {
		writeVLLMPage(&b, model, lora, start, sts, now)
	}
	return b.String()
}

// writeSGLangRankPage writes an SGLang page of several data-parallel
// ranks (see [RenderRankMetrics]).
func writeSGLangRankPage(b *strings.Builder, model string, start int, sts []Stats) {
	family := func(name, typ, help string) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	server := fmt.Sprintf("model_name=%q", model)
	labels := func(i int) string {
		return fmt.Sprintf("%s,engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\",dp_rank=\"%d\"", server, start+i)
	}
	gauge := func(name, help string, v func(Stats) float64) {
		family(name, "gauge", help)
		for i, st := range sts {
			fmt.Fprintf(b, "%s{%s} %s\n", name, labels(i), formatFloat(v(st)))
		}
	}
	gauge("sglang:num_running_reqs", "The number of running requests", func(st Stats) float64 { return float64(st.Running) })
	gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue", func(st Stats) float64 { return float64(st.Waiting) })
	gauge("sglang:token_usage", "The token usage", func(st Stats) float64 { return st.KVUsage })
	gauge("sglang:num_used_tokens", "The number of used tokens", func(st Stats) float64 { return st.KVUsage * float64(st.BlockSize*st.NumBlocks) })
	family("sglang:cache_config_info", "gauge", "Information of the cache config")
	for i, st := range sts {
		fmt.Fprintf(b, "sglang:cache_config_info{%s,num_pages=\"%d\",page_size=\"%d\"} 1.0\n", labels(i), st.NumBlocks, st.BlockSize)
	}
	var total Stats
	for _, st := range sts {
		total.PromptTokens += st.PromptTokens
		total.GenerationTokens += st.GenerationTokens
	}
	family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
	fmt.Fprintf(b, "sglang:prompt_tokens_total{%s} %s\n", server, formatFloat(float64(total.PromptTokens)))
	family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.")
	fmt.Fprintf(b, "sglang:generation_tokens_total{%s} %s\n", server, formatFloat(float64(total.GenerationTokens)))
	family("sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.")
	histogramSamples(b, "sglang:time_to_first_token_seconds", server, total.GenerationTokens)
}

// writeVLLMPage writes a vLLM page, one series per rank.
func writeVLLMPage(b *strings.Builder, model string, lora bool, start int, sts []Stats, now time.Time) {
	family := func(name, typ, help string) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	labels := func(i int) string { return fmt.Sprintf("engine=\"%d\",model_name=%q", start+i, model) }
	gauge := func(name, typ, help string, v func(Stats) float64) {
		family(name, typ, help)
		for i, st := range sts {
			fmt.Fprintf(b, "%s{%s} %s\n", name, labels(i), formatFloat(v(st)))
		}
	}
	gauge("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", func(st Stats) float64 { return float64(st.Running) })
	gauge("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", func(st Stats) float64 { return float64(st.Waiting) })
	gauge("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", func(st Stats) float64 { return st.KVUsage })
	gauge("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", func(st Stats) float64 { return float64(st.PromptTokens) })
	gauge("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", func(st Stats) float64 { return float64(st.GenerationTokens) })
	family("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.")
	for i, st := range sts {
		histogramSamples(b, "vllm:time_to_first_token_seconds", labels(i), st.GenerationTokens)
	}
	family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	for i, st := range sts {
		fmt.Fprintf(b, "vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"%d\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"%d\"} 1.0\n",
			st.BlockSize, start+i, st.NumBlocks)
	}
	if lora {
		st := sts[0]
		family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
		fmt.Fprintf(b, "vllm:lora_requests_info{max_lora=\"%d\",running_lora_adapters=%q,waiting_lora_adapters=%q} %s\n",
			st.MaxLoRA, strings.Join(st.RunningAdapters, ","), strings.Join(st.WaitingAdapters, ","), formatFloat(float64(now.UnixNano())/1e9))
	}
}

// histogramSamples writes a histogram's lines for one label set.
func histogramSamples(b *strings.Builder, name, labels string, count int64) {
	fmt.Fprintf(b, "%s_bucket{%s,le=\"0.1\"} %s\n", name, labels, formatFloat(float64(count)))
	fmt.Fprintf(b, "%s_bucket{%s,le=\"+Inf\"} %s\n", name, labels, formatFloat(float64(count)))
	fmt.Fprintf(b, "%s_count{%s} %s\n", name, labels, formatFloat(float64(count)))
	fmt.Fprintf(b, "%s_sum{%s} %s\n", name, labels, formatFloat(float64(count)*0.05))
}
