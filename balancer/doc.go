// Package balancer holds the set of model-server backends, the immutable
// snapshot the request path reads, the in-flight ledger and the picker.
//
// Writers (discovery, health checks, model discovery) call [Balancer.Update];
// each call builds a new immutable [Snapshot] and swaps it in atomically.
// Readers load the current snapshot without a lock and never wait on writers
// or on I/O. A pick that attaches a guard ([Request.Guard], as every proxied
// request does) holds one mutex for the microseconds it reads the ledgers,
// chooses and attaches, so that a burst of picks does not all choose the
// backend that looked idlest. Counters that must survive a rebuild
// (requests in flight, request totals, time-to-first-byte estimates) live
// in a long-lived [Ledger] per backend whose pointer every snapshot copies,
// as grpc-go's leastrequest balancer does.
//
// A pick runs in named stages (pick.go): the prompt is hashed and matched
// (match.go), the backends are filtered into candidates and saturated ones
// set aside (candidate.go), the policy's scorers and picker choose, and a
// saturated fleet queues (admission.go). A policy is a [Preset] built once
// per balancer (preset.go, policy.go): llmlb's own is [TTFTScorer]
// (ttft.go) with [TTFTPicker] (place.go); the peers' are in peers.go,
// epp.go, ring.go and sglang.go. Why a pick chose is a [Reason] (reason.go).
// The evidence behind the ttft policy's rules is in docs/design/ttft.md.
//
// Passive health is decided here, where picks are made (passive.go): the
// proxy reports each failed request with [Balancer.Failed]; the ledger keeps
// the streak and the ejection; the pick's filter skips an ejected backend
// until its time is over and scrape's readmission probe, reported with
// [Balancer.Probed], says it answers again.
package balancer
