// Package engine is tokenshard's public API: a keyed token-bucket admission
// engine with exact integer arithmetic, a hard bound on tracked keys, and
// policy cutovers that give nobody free tokens.
//
// New starts one goroutine per shard. Allow and AllowBatch route each key by
// a per-engine seeded hash to the shard that owns it, and the shard decides
// inside its own goroutine at its own clock reading. ReplacePolicy and
// EvictFull go through a coordinator that serialises them. Close stops every
// goroutine the engine started.
//
// A single Allow costs one goroutine hand-off (send, decide, reply), so for
// throughput prefer AllowBatch: one message per shard carries many requests,
// decided at one clock reading.
//
// # Ownership
//
// Bucket state is read and written only by the shard goroutine that owns it
// (package shard); no lock guards it. The Engine itself holds immutable
// configuration, the shards' mailboxes, the atomic key budget that all shards
// share, the current policy (an atomic pointer written only by the coordinator
// while it holds the coordinator slot) and the pools of reusable messages. A
// pooled message belongs to exactly one call between Get and Put.
package engine
