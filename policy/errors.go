package policy

import "errors"

// ErrInvalid reports a Policy, an Override or a Limiter's arguments that
// cannot be used: a Version, Capacity, TokensPerSecond or window below 1, a
// blank or repeated Match, too many patterns. Errors from Validate,
// NewOverrideSet and the Limiter constructors wrap it and name the offending
// field or entry; test with errors.Is.
var ErrInvalid = errors.New("policy: invalid")
