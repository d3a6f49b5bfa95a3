package policy

import "errors"

// ErrInvalid reports a Policy, an Override or a Limiter's arguments that
// cannot be used: a Version, Capacity or window below 1, a rate missing,
// set twice or below 1, a blank or repeated Match, too many bands,
// patterns or distinct limits, a bad band or name, a TokenBucket's
// starting reading below 0. Errors from Validate, NewBands, NewOverrideSet
// and the Limiter constructors wrap it and name the offending field or
// entry; test with errors.Is.
var ErrInvalid = errors.New("policy: invalid")
