package model

import "github.com/tokenshard/tokenshard/internal/decision"

// Decision is the model's answer to one admission request: the one
// definition of a decision's fields below package engine (see package
// internal/decision), with engine.Decision's meaning, so a caller converts
// one to the other as package engine does. An error always comes with the
// zero Decision, and a denial is a Decision with Allowed false, never an
// error. A Decision is a plain value: copy it freely.
type Decision = decision.Decision

// Request is one request of a batch.
type Request struct {
	Key  string
	Cost int64
}

// Result is the answer to one Request: a Decision, or an error with the
// zero Decision.
type Result struct {
	Decision Decision
	Err      error
}
