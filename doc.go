// Command llmlb is a load balancer for LLM inference servers (vLLM, SGLang,
// Triton TensorRT-LLM, trtllm-serve): one binary, one YAML file.
//
//	llmlb serve [--config config.yaml]     run the balancer
//	llmlb validate [--config] config.yaml  check a config file
//	llmlb probe [flags] URL|FILE           show what the balancer reads from a metrics page
//	llmlb sim [flags]                      run emulated model servers
//	llmlb demo [flags]                     emulated servers + balancer + traffic, live view
//	llmlb bench [flags]                    routing benchmark in virtual time
//	llmlb overhead [flags]                 proxy overhead against HAProxy and nginx
//	llmlb version                          version and build information
package main
