// Package proxy is llmlb's HTTP front: the chi routes (inference routes
// only), limits and timeouts, API keys with their models, priorities and
// rate limits, HTTPS with certificates reloaded from disk, OpenAI request
// parsing, forwarding with httputil.ReverseProxy, retries before the first
// byte, SSE streaming, OpenAI-shaped errors, the balancer's own metrics,
// the admin listener and the status page. Each client request is one
// exchange (exchange.go) that the handler's stages fill in and that is
// finished, counted and logged in one place.
package proxy
