package msg

// Hold makes a Batch one shard's part of an all-or-nothing decision over
// keys of several shards (engine's AllowAll). Its Items are distinct keys,
// each with the sum of its requests' costs. The shard checks the part at
// its reading and answers on the Batch's Done, as for any part, with Now
// and Version set and an error, if any, in Out: ErrCostExceedsCapacity for
// the first item whose key cannot ever hold its cost, else
// ErrClockRegression. With no error it holds the part's keys: requests for
// them wait until the caller's Commit or Abort on In, and every other key
// is served meanwhile. A control message (a cutover, a sweep, a snapshot)
// or stop that comes before Eval makes it give the hold up, answering
// Aborted on Out, so neither ever waits on a hold that waits on them. Eval
// (once) asks for every item's decision at the reading T, taken by
// nothing: the answers come in the Batch's Out, announced on Out, and from
// then on the shard waits for Commit or Abort only, which the caller sends
// at once. The caller announces each command it sends on In with the
// shard's Mailbox.SignalHold. A hold ends with exactly one last message on
// Out: Aborted if the shard gave it up, else the shard's word that it
// carried out the caller's Commit or Abort. Nobody waits for that word: the
// shard acts on Commit or Abort before it serves its keys again, which is
// all the caller needs. It is internal to tokenshard: only packages engine
// and shard use it.
type Hold struct {
	In  chan HoldCmd   // one slot: the caller's Eval, then Commit or Abort
	Out chan HoldReply // one slot: Eval's answer, then the end
	// Last: the caller has every other part held already, the latest of
	// their readings in T. The shard then evaluates at once, at the later
	// of T and its own reading, as if Eval had come: its answer is the
	// Done that says it holds, and it waits for Commit or Abort only.
	Last    bool
	T       int64
	Now     int64 // the shard's reading when it took the hold
	Version int64 // of the policy the shard checked the part under
	// Fresh lists the items whose keys the shard does not track. The key
	// bound's room for them is the caller's to reserve, once it knows the
	// call is admitted, so that no other call ever finds the bound full for
	// keys that are not created; a Commit that admits creates them in the
	// room the caller reserved.
	Fresh []int
	// Requests is how many of the call's requests name the part's keys
	// (more than its Items when a key is named twice): the decisions the
	// shard counts, all allowed or all denied, when it carries out Commit.
	Requests int
}

// HoldCmd is a step of a hold. It is internal to tokenshard: only packages
// engine and shard use it.
type HoldCmd struct {
	Op    HoldOp
	T     int64 // Eval and Commit: the instant every part is decided at
	Admit bool  // Commit: take every item's cost (else take nothing)
}

// HoldOp says what a HoldCmd asks. It is internal to tokenshard: only
// packages engine and shard use it.
type HoldOp uint8

const (
	HoldEval HoldOp = iota
	HoldCommit
	HoldAbort
)

// HoldReply answers Eval (the decisions are in the Batch's Out), or ends the
// hold: Aborted if the shard gave it up. It is internal to tokenshard: only
// packages engine and shard use it.
type HoldReply struct{ Aborted bool }

// NewHold returns a Hold with its channels made: one per part per attempt,
// so no stale message of an earlier attempt is ever read. It is internal to
// tokenshard: only packages engine and shard use it.
func NewHold() *Hold {
	return &Hold{In: make(chan HoldCmd, 1), Out: make(chan HoldReply, 1)}
}
