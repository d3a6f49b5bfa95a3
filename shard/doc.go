// Package shard is one goroutine that exclusively owns a map of buckets and
// serves the messages of package msg.
//
// It is split in two, after etcd's raft: State is a pure state machine whose
// handlers take the clock reading as a parameter and return the reply (tests
// call them directly, with no goroutine), and Shard.Run is the loop that
// receives from the Mailbox, reads the clock once per group of messages,
// dispatches to State and replies.
//
// # Ownership
//
// The bucket map, the policy generations, the staged cutover state and the
// sweep pass in progress are read and written only by the goroutine running
// Shard.Run (or, in tests, the
// one goroutine calling State's methods). The Budget is the only state shared
// between shards, and it is a single atomic counter. The Mailbox (its queue
// of single requests, its channels and its counters) is the only thing both
// callers and the owner touch.
package shard
