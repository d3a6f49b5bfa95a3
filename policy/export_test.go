package policy

// CeilDiv exposes ceilDiv to the external test package, so its corner cases
// can be pinned down directly as well as through RetryAfter and ResetAfter.
var CeilDiv = ceilDiv
