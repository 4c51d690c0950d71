// Package cluster keeps the state llmlb replicas share in Redis (or
// Valkey): each API key's limits, session homes, and each replica's
// work in flight per backend. Without cluster.redis it is not built and
// llmlb is one process.
//
// Redis is never on a request's critical path for longer than
// [RedisConfig.Timeout]: a failed or slow call marks the fleet state
// down, every replica goes on alone (its own limits, sessions and
// ledger), and a background ping rejoins it when Redis answers again.
// Writes that need no answer (token charges, session homes) go through
// one queue, written in pipelines, and are dropped and counted when it
// is full.
package cluster
