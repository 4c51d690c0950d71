// Package overhead measures what a proxy adds per request: the benchmark
// behind `llmlb overhead`. [Run] starts one fast emulated vLLM server on
// loopback and puts llmlb (run as `llmlb serve`), HAProxy and nginx in
// front of it in turn, next to a direct connection, and drives each
// [Scenarios] entry through them with [Load], a closed-loop HTTP load
// generator that times whole answers, first tokens and inter-token gaps
// of streams, while the proxy's CPU time and peak memory are read from
// /proc (proc.go); [Write] prints the [Report] as tables. A proxy that is not
// installed is a skipped row unless [Options].Require (LLMLB_REQUIRE_PROXIES=1
// in CI) makes it an error.
package overhead
