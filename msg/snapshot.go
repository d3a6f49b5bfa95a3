package msg

import "github.com/tokenshard/tokenshard/policy"

// Snapshot asks a shard to copy its buckets, a chunk at a time, while it
// goes on serving. The shard answers on Begin with its clock reading, then,
// each time it can take a chunk from Free, fills it with the next buckets
// and sends it on Out; the chunk that ends its walk has Last set. It stops
// early, sending nothing more, once Cancel is closed. Out has room for every
// chunk in circulation, so a shard never blocks on it: a slow writer only
// keeps chunks from coming back to Free, which pauses the copy, not serving.
// It is internal to tokenshard: only packages engine and shard use it.
type Snapshot struct {
	Begin  chan int64 // one-slot buffer
	Free   chan *SnapChunk
	Out    chan<- *SnapChunk
	Cancel <-chan struct{}
}

// SnapChunk is one slice of a shard's buckets: Records, whose keys are
// Keys[r.KeyOff : r.KeyOff+r.KeyLen] and whose levels are
// Levels[r.LevelOff : r.LevelOff+r.Shape.Len()]. Free is where the writer
// returns it. It is internal to tokenshard: only packages engine and shard
// use it.
type SnapChunk struct {
	Records []SnapRecord
	Keys    []byte
	Levels  []policy.Level
	Last    bool
	Free    chan *SnapChunk
}

// SnapRecord is one bucket, brought to the policy in force: the reading it
// was last brought up to date at, its key's limit under that policy and its
// levels, one per band. It is internal to tokenshard: only packages engine
// and shard use it.
type SnapRecord struct {
	KeyOff, KeyLen int
	Last           int64
	Limit          policy.LimitIndex // Shape's index in the policy's limit table
	Shape          policy.Shape
	LevelOff       int
}
