// Package e2e holds llmlb's end-to-end tests: the balancer as
// internal/serve starts it, in front of emulated servers over real HTTP,
// and the real tools around it (Prometheus, Chromium, the OpenAI SDKs).
// They assert outcomes (every request answered, every ledger back to
// zero); timed behaviour is tested in virtual time in the packages.
package e2e
