// Package balancer holds the set of model-server backends, the immutable
// snapshot the request path reads, the in-flight ledger and the picker.
//
// Writers (discovery, health checks, model discovery) call [Balancer.Update];
// each call builds a new immutable [Snapshot] and swaps it in atomically.
// Readers ([Balancer.Pick], [Balancer.Snapshot]) never lock. Counters that must
// survive a rebuild (requests in flight, request totals, time-to-first-byte
// estimates) live in a long-lived [Ledger] per backend whose pointer every
// snapshot copies, as grpc-go's leastrequest balancer does.
//
// Passive health is decided here, where picks are made (passive.go): the
// proxy reports each failed request with [Balancer.Failed]; the ledger keeps
// the streak and the ejection; the pick's filter skips an ejected backend
// until its time is over and scrape's readmission probe, reported with
// [Balancer.Probed], says it answers again.
package balancer
