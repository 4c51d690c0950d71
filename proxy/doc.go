// Package proxy is llmlb's HTTP front: the chi routes (inference routes
// only), limits and timeouts, API keys with their models, priorities and
// rate limits, HTTPS with certificates reloaded from disk, parsing of the
// OpenAI completions, chat and Responses and Anthropic Messages requests,
// stored responses, P/D legs, forwarding with httputil.ReverseProxy,
// retries before the first byte, API-shaped errors, tracing, the
// balancer's own metrics, the admin listener and the status page. Each
// client request is one exchange (exchange.go) that the handler's stages
// fill in and that is finished, counted and logged in one place. A
// streamed answer goes through the stream pipeline (package
// proxy/stream), and one that breaks is continued on another server
// (continue.go).
package proxy
