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
// is a field of engine.Decision, of the same type (Band, a Name here, is
// its string there), and is copied.
package decision

import (
	"strconv"
	"time"
)

// Decision is the answer to one admission request, as a shard or the model
// writes it: the fields of engine.Decision that they set, with the same
// names, types (but Band's: see Name) and meaning (engine.Decision's
// documentation is the contract). An error always comes with the zero
// Decision, and a denial is a Decision with Allowed false, never an error.
// It is internal to tokenshard: package engine converts it to
// engine.Decision.
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
// a pointer to the name, one word where a string takes two, so that a
// single request's message, reply included, fits in two cache lines (see
// msg.Single). The zero Name is "". Two Names of equal strings may differ
// as values: compare them with String, or as reflect.DeepEqual (and so
// testify) does, which compares the strings.
type Name struct{ p *string }

// NameOf returns s as a Name. It allocates: the shards make their Names
// with NameAt when a policy is installed, not per decision.
func NameOf(s string) Name { return NameAt(&s) }

// NameAt returns the Name of the string at p, which must never change.
func NameAt(p *string) Name {
	if *p == "" {
		return Name{}
	}
	return Name{p}
}

// String returns the name.
func (n Name) String() string {
	if n.p == nil {
		return ""
	}
	return *n.p
}

// GoString shows the name, for test failures.
func (n Name) GoString() string { return "decision.NameOf(" + strconv.Quote(n.String()) + ")" }
