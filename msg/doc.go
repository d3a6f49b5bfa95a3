// Package msg defines the messages that travel between the engine and its
// shards: one struct per request kind, each carrying values and its own reply
// channel, and the sentinel errors a shard can answer with.
//
// The package is internal to tokenshard: only packages engine and shard
// import it (engine's TestImportLayers holds that), and every name it
// exports is used by one of them.
//
// # Ownership
//
// A message belongs to its sender until the send succeeds, then to the
// receiving shard until it replies, then to the sender again. The reply
// channels have room for every reply they will carry (one slot, or one per
// part of a batch call), so a shard never blocks on a reply, and the
// receive on them is what orders the shard's writes into the message before
// the sender's reads. A single request (Single) replies through an atomic
// stage first and uses its channel only if its sender has parked (see
// Single.Finish and Single.Wait); the atomic step orders the writes the same
// way. Messages are pooled by the engine and reused.
package msg
