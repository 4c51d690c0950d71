// Package proxy is llmlb's HTTP front: the chi routes (inference routes
// only), limits and timeouts, OpenAI request parsing, forwarding with
// httputil.ReverseProxy, retries before the first byte, SSE streaming,
// OpenAI-shaped errors, the balancer's own metrics, the admin listener and
// the status page.
package proxy
