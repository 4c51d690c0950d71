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
	histogram := func(name, labels string, count int64) {
		family(name, "histogram", "Histogram of time to first token in seconds.")
		fmt.Fprintf(&b, "%s_bucket{%s,le=\"0.1\"} %s\n", name, labels, formatFloat(float64(count)))
		fmt.Fprintf(&b, "%s_bucket{%s,le=\"+Inf\"} %s\n", name, labels, formatFloat(float64(count)))
		fmt.Fprintf(&b, "%s_count{%s} %s\n", name, labels, formatFloat(float64(count)))
		fmt.Fprintf(&b, "%s_sum{%s} %s\n", name, labels, formatFloat(float64(count)*0.05))
	}
	switch engine {
	case "sglang":
		l := fmt.Sprintf("model_name=%q", model)
		family("sglang:num_running_reqs", "gauge", "The number of running requests")
		sample("sglang:num_running_reqs", l, float64(st.Running))
		family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue")
		sample("sglang:num_queue_reqs", l, float64(st.Waiting))
		family("sglang:token_usage", "gauge", "The token usage")
		sample("sglang:token_usage", l, st.KVUsage)
		family("sglang:num_used_tokens", "gauge", "The number of used tokens")
		sample("sglang:num_used_tokens", l, st.KVUsage*float64(st.BlockSize*st.NumBlocks))
		family("sglang:cache_config_info", "gauge", "Information of the cache config")
		sample("sglang:cache_config_info", fmt.Sprintf("%s,num_pages=\"%d\",page_size=\"%d\"", l, st.NumBlocks, st.BlockSize), 1)
		family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
		sample("sglang:prompt_tokens_total", l, float64(st.PromptTokens))
		family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.")
		sample("sglang:generation_tokens_total", l, float64(st.GenerationTokens))
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
		family("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model.")
		sample("nv_inference_pending_request_count", l, float64(st.Waiting))
		histogram("nv_inference_first_response_histogram_ms", l, st.GenerationTokens)
	case "trtllm-serve":
		l := fmt.Sprintf("engine_type=\"pytorch\",model_name=%q", model)
		family("trtllm_num_requests_running", "gauge", "Number of active requests")
		sample("trtllm_num_requests_running", l, float64(st.Running))
		family("trtllm_num_requests_waiting", "gauge", "Number of queued requests")
		sample("trtllm_num_requests_waiting", l, float64(st.Waiting))
		family("trtllm_kv_cache_utilization", "gauge", "KV cache utilization")
		sample("trtllm_kv_cache_utilization", l, st.KVUsage)
		family("trtllm_kv_cache_tokens_per_block", "gauge", "Tokens per KV cache block")
		sample("trtllm_kv_cache_tokens_per_block", l, float64(st.BlockSize))
		family("trtllm_kv_cache_max_blocks", "gauge", "Maximum number of KV cache blocks")
		sample("trtllm_kv_cache_max_blocks", l, float64(st.NumBlocks))
		family("trtllm_prompt_tokens_total", "counter", "Cumulative number of prompt (input) tokens processed.")
		sample("trtllm_prompt_tokens_total", l, float64(st.PromptTokens))
		histogram("trtllm_time_to_first_token_seconds", l, st.GenerationTokens)
	default: // vllm
		l := fmt.Sprintf("engine=\"0\",model_name=%q", model)
		family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
		sample("vllm:num_requests_running", l, float64(st.Running))
		family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
		sample("vllm:num_requests_waiting", l, float64(st.Waiting))
		family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
		sample("vllm:kv_cache_usage_perc", l, st.KVUsage)
		family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
		sample("vllm:prompt_tokens_total", l, float64(st.PromptTokens))
		family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.")
		sample("vllm:generation_tokens_total", l, float64(st.GenerationTokens))
		histogram("vllm:time_to_first_token_seconds", l, st.GenerationTokens)
		family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
		sample("vllm:cache_config_info", fmt.Sprintf("block_size=\"%d\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"%d\"", st.BlockSize, st.NumBlocks), 1)
		if lora {
			family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
			sample("vllm:lora_requests_info", fmt.Sprintf("max_lora=\"%d\",running_lora_adapters=%q,waiting_lora_adapters=%q",
				st.MaxLoRA, strings.Join(st.RunningAdapters, ","), strings.Join(st.WaitingAdapters, ",")), float64(now.UnixNano())/1e9)
		}
	}
	return b.String()
}
