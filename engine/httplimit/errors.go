package httplimit

import "errors"

// Errors returned by this package. Test for them with errors.Is.
var (
	// ErrInvalidOption: New was given a nil engine or an option it cannot
	// use; the wrapping error names which one.
	ErrInvalidOption = errors.New("httplimit: invalid option")
	// ErrNoClientIP: the request's RemoteAddr holds no IP address (a Unix
	// socket listener, or a handler that rewrote it). Returned by ClientIP,
	// and so by the default key function, which answers 500.
	ErrNoClientIP = errors.New("httplimit: no client IP in request")
)
