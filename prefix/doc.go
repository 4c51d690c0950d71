// Package prefix turns prompts into canonical bytes, cuts them into chained
// block hashes and keeps an approximate index of which backend holds which
// blocks in its prefix cache. It knows nothing of HTTP or of backends beyond
// the small integer slot the balancer gives each one.
//
// The balancer never sees a server's cache; the index remembers what was
// sent where. Two requests share a cached prefix on a server exactly when
// the engine's chat template renders them to the same leading tokens, so
// the canonical form keeps everything a template renders (roles, names,
// every content part, tool calls and tool definitions) in order, and
// nothing a template ignores (JSON key order, whitespace). Requests of
// the OpenAI Responses and Anthropic Messages APIs, which engines serve by
// turning them into chat messages, are written as those chat messages.
package prefix
