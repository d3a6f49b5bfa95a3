// Package decision defines Decision, the one form in which the layers below
// package engine write the answer to an admission request: the shards
// (through package msg's replies and events) and the sequential model
// (internal/model). It sits at the bottom of the import graph, on the
// standard library alone, so that both may use it, and it is internal to
// tokenshard.
//
// The public type is engine.Decision, which documents every field and may
// have fields of its own (ones the engine never sets, such as a store's).
// Package engine converts a Decision to it in one place, which zeroes the
// fields a Decision lacks, and its tests check that every field of Decision
// is a field of engine.Decision, of the same type, and is copied.
package decision

import (
	"time"
	"unique"
)

// Decision is the answer to one admission request, as a shard or the model
// writes it: the fields of engine.Decision that they set, with the same
// names, types and meaning (engine.Decision's documentation is the
// contract). An error always comes with the zero Decision, and a denial is
// a Decision with Allowed false, never an error. It is internal to
// tokenshard: package engine converts it to engine.Decision.
type Decision struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
	Version    int64
	Limit      int64
	ResetAfter time.Duration
	Band       Name
}

// Name is a band's name (engine.Decision.Band) as a Decision carries it:
// interned, so that it takes one word where a string takes two, and a
// single request's message, reply included, fits in two cache lines (see
// msg.Single). The zero Name is "". Names made from equal strings are
// equal, so Decisions compare as they did with a string.
type Name struct{ h unique.Handle[string] }

// NameOf interns s. It may allocate: call it when a policy is installed,
// not per decision.
func NameOf(s string) Name {
	if s == "" {
		return Name{}
	}
	return Name{unique.Make(s)}
}

// String returns the name.
func (n Name) String() string {
	if n == (Name{}) {
		return ""
	}
	return n.h.Value()
}
