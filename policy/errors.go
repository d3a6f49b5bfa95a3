package policy

import "errors"

// ErrInvalid reports a Policy that cannot be used: Version, Capacity or
// TokensPerSecond below 1. Errors from Validate wrap it with the offending
// field; test with errors.Is.
var ErrInvalid = errors.New("policy: invalid")
