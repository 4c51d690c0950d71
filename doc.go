// Command llmlb is a load balancer for LLM inference servers (vLLM, SGLang,
// Triton TensorRT-LLM, trtllm-serve): one binary, one YAML file. `llmlb
// help` lists its commands; each command's file here parses its flags and
// calls the package that does the work.
package main
