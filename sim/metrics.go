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

// RenderRankMetrics writes the vLLM page of a server of data-parallel
// ranks: each family once, with one series per rank labelled
// engine="<global rank>" (sts[i] is rank start+i), as vLLM's
// PrometheusStatLogger labels them (vllm/v1/metrics/loggers.py at
// a6f0308c).
func RenderRankMetrics(model string, lora bool, start int, sts []Stats, now time.Time) string {
	var b strings.Builder
	writeVLLMPage(&b, model, lora, start, sts, now)
	return b.String()
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
