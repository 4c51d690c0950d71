// Package scrape watches the backends: which exist (a static list, or DNS
// A/AAAA and SRV names re-resolved on an interval), whether each is alive
// (active health checks, and the probes that readmit a backend the
// balancer's passive health ejected), which engine each is (declared or detected from
// its own pages), what it serves (configured, or learned from its
// /v1/models) and what its Prometheus metrics say, read with each engine's
// own metric names. It hands complete backend states to
// [balancer.Balancer.Update].
package scrape
