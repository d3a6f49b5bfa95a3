package grpclimit

import "errors"

// ErrInvalidOption is returned, wrapped, by New when it is given a nil
// engine or an option it cannot use; the wrapping error names which one.
// Test for it with errors.Is. The interceptors return only gRPC status
// errors, listed in the package documentation.
var ErrInvalidOption = errors.New("grpclimit: invalid option")
