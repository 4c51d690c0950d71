// Package kvevents keeps an exact index of what each server's prefix cache
// holds, fed by the KV-cache events the engine publishes, so that replicas
// of the balancer that never talk to each other all know where every
// prefix is, whoever routed it.
//
// vLLM publishes the events when started with --kv-events-config
// (vllm/distributed/kv_events.py): a ZeroMQ PUB socket sends multipart
// messages [topic, sequence number (8 bytes, big-endian), payload], the
// payload a msgpack-encoded batch of BlockStored (the new blocks' hashes,
// their parent's hash and their token ids), BlockRemoved (hashes) and
// AllBlocksCleared events; an optional ROUTER socket replays the batches
// from a given sequence number. Older vLLM releases encode batches and
// events as arrays, newer ones as maps; [Decode] reads both.
//
// The engine's block hashes depend on its hash algorithm and seed, so the
// index does not use them as keys: it re-hashes each stored block's token
// ids, chained to its parent's, with xxhash ([Chain]), and keeps the
// engine's hash only to find a block again when it is removed or extended.
// A prompt matches by the same chain over its token ids, which a tokenizer
// must supply ([Tokenizer]); a block whose parent the index never saw
// (stored before the subscription began) cannot be named and is left out.
package kvevents
