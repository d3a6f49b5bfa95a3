// Package shard is one goroutine that exclusively owns a table of buckets and
// serves the messages of package msg.
//
// It is split in two, after etcd's raft: State is a pure state machine whose
// handlers take the clock reading as a parameter and write the reply (tests
// call them directly, with no goroutine), and Shard.Run is the loop that
// receives from the Mailbox, reads the clock once per message, dispatches to
// the same State handlers and replies.
//
// The package is internal to tokenshard: only package engine imports it
// (engine's TestImportLayers holds that), and it exports only what engine
// uses. State's handlers are unexported: the loop calls them, and so do
// the package's own tests.
//
// # Where things are
//
//   - shard.go: the loop. Shard.turn is one pass of it and states the
//     precedence between kinds of work; inputs switches inputs off with nil
//     channels.
//   - serve.go: the data path: groups of single requests and batch parts.
//   - task.go: background work (sweeps, conversion passes, snapshots), run a
//     slice at a time between messages behind one small interface.
//   - counters.go: what a shard counts, published for Stats.
//   - state.go: State's handlers for decisions, Peek, Refund, cutovers and
//     restores; sweep.go: its resumable passes over the table.
//   - table*.go: the bucket table (an extendible hash of Swiss-table
//     segments): its layout, probing, directory and cache warming.
//   - mailbox.go, queue.go, control.go: how requests reach the loop.
//   - budget.go: the engine-wide key bound. hash*.go: the seeded key hash.
//
// # Adding a message kind
//
// A control message (one the coordinator sends, such as a sweep):
//
//  1. msg: a struct for it, with a one-slot reply channel.
//  2. Mailbox: a channel of it, made in NewMailbox, and a send method in
//     control.go that counts itself in control while it waits, as Sweep does.
//  3. State: the handler, taking the clock reading and the message's values,
//     with tests that call it directly.
//  4. Shard: the channel in inputs (switched off where it must wait), and a
//     case in turn's control select and in park's select calling the
//     handler. If it starts work to be done in slices, the handler sets
//     Shard.task to a type implementing task (task.go) instead.
//
// A data message goes through serveData instead, after control.
//
// # Ownership
//
// The bucket table, the policy generations, the staged cutover state, the
// pass in progress and the counters are read and written only by the
// goroutine running Shard.Run (or, in tests, the one goroutine calling
// State's methods). The Budget is the only state shared between shards, and
// it is a single atomic counter. The Mailbox (its queue of single requests,
// its channels and its counters) is the only thing both callers and the
// owner touch, and published counters are atomics the owner stores and
// anyone may load.
package shard
