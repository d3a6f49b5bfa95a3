package grpclimit

import (
	"errors"

	"google.golang.org/grpc/status"
)

// ErrInvalidOption is returned, wrapped, by New when it is given a nil
// engine or an option it cannot use; the wrapping error names which one.
// Test for it with errors.Is. The interceptors return only gRPC status
// errors, listed in the package documentation.
var ErrInvalidOption = errors.New("grpclimit: invalid option")

// Causes of the errors given to the function of WithOnError, besides the
// engine's own (engine.ErrClosed, engine.ErrKeyCapacity,
// engine.ErrInvalidCost, engine.ErrInvalidKey, a store's failure) and a
// context's. Test for them with errors.Is.
var (
	// ErrNoPeerIP: the call has no default key, as its peer has no IP
	// address (a Unix socket) and no WithKey function is set.
	ErrNoPeerIP = errors.New("grpclimit: the peer has no IP address")
	// ErrKeyFunc: the WithKey function returned an error, which the error
	// also wraps; but not an error that is the call's context ending, which
	// is answered as that (Canceled, DeadlineExceeded): the context's error,
	// or, once it has ended, a gRPC status of the same code.
	ErrKeyFunc = errors.New("grpclimit: the key function failed")
	// ErrCostFunc: the WithCost function returned a cost below 1.
	ErrCostFunc = errors.New("grpclimit: the cost function returned less than 1")
	// ErrDegraded: a store's failure rule answered instead of a bucket
	// (engine.Decision.Degraded), as a store does when it cannot reach its
	// backing server: it denied the call (failing closed), or it answered
	// a charge of Settle, which may not have been taken.
	ErrDegraded = errors.New("grpclimit: answered by the store's failure rule")
)

// callError is the error the function of WithOnError is given: status
// (status.Code, status.FromError) is the status the call was answered with,
// or in shadow mode would have been, and Unwrap gives its cause.
type callError struct {
	status *status.Status
	cause  error
}

func (e *callError) Error() string              { return e.status.Message() + ": " + e.cause.Error() }
func (e *callError) Unwrap() error              { return e.cause }
func (e *callError) GRPCStatus() *status.Status { return e.status }
