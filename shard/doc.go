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
//     precedence between kinds of work; listen is its one select, and
//     inputs switches inputs off with nil channels.
//   - serve.go: the data path: groups of single requests and batch parts;
//     serve is the one place a single request is decided.
//   - hold.go, state_hold.go: AllowAll's holds on keys.
//   - task.go: background work (sweeps, conversion passes, snapshots), run a
//     slice at a time between messages behind one small interface.
//   - counters.go: what a shard counts, published for Stats.
//   - state.go: State's handlers for decisions, Peek, Refund, cutovers and
//     restores; sweep.go: its resumable passes over the table.
//   - table*.go: the bucket table (an extendible hash of Swiss-table
//     segments): its layout, probing, directory and cache warming.
//   - mailbox.go, queue.go: how requests reach the loop; control.go: the
//     control kinds and how they are sent.
//   - budget.go: the engine-wide key bound. hash*.go: the seeded key hash.
//
// # Adding a message kind
//
// A control message (one the coordinator sends, such as a sweep) takes
// three places:
//
//  1. msg: a struct for it, with a one-slot reply channel.
//  2. State: the handler, taking the clock reading and the message's
//     values, with tests that call it directly.
//  3. control.go: a control type wrapping the message, whose gate says when
//     the loop may take it (always, unless it must wait for a cutover's
//     room or for background work to end) and whose serve calls the
//     handler and replies, and a Mailbox method that sends it with send.
//     If it starts work to be done in slices, serve sets Shard.task to a
//     type implementing task (task.go).
//
// The loop needs no change for a kind that uses an existing gate: it
// listens on one channel per gate, and every hold ends before serve runs.
// A new gate needs its constant and a case in listen's select. control_recipe_test.go adds a kind this way.
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
// owner touch, and published counters (and the count of work kept aside
// behind holds, Waiting) are atomics the owner stores and anyone may load.
package shard
