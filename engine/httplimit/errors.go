package httplimit

import "errors"

// Errors returned by this package, or given to a WithOnError function. Test
// for them with errors.Is.
var (
	// ErrInvalidOption: New was given a nil engine or an option it cannot
	// use; the wrapping error names which one.
	ErrInvalidOption = errors.New("httplimit: invalid option")
	// ErrNoClientIP: the request's RemoteAddr holds no IP address (a Unix
	// socket listener, or a handler that rewrote it). Returned by ClientIP,
	// and so by the default key function, which answers 500. A WithClientKey
	// or WithKeys function is called with client "" instead, and may return
	// it to answer the request so.
	ErrNoClientIP = errors.New("httplimit: no client IP in request")
	// ErrKeyFunc: the WithKey, WithClientKey or WithKeys function returned
	// an error, which the error given to WithOnError wraps too. Answered
	// with 500; but an error returned once the request's context has
	// ended (a lookup canceled with it) is answered as that ending (503,
	// no body), and is not ErrKeyFunc.
	ErrKeyFunc = errors.New("httplimit: the key function failed")
	// ErrCostBelowOne: the WithCost function, or a request of a WithKeys
	// function, gave a cost below 1. Answered with 500.
	ErrCostBelowOne = errors.New("httplimit: cost below 1")
	// ErrDegraded: a store's failure rule answered instead of a bucket
	// (engine.Decision.Degraded): it denied the request, answered with
	// 503, the wrapping error giving the decision's RetryAfter; or it
	// answered a charge of Settle, which may not have been taken.
	ErrDegraded = errors.New("httplimit: answered by the store's failure rule")
	// ErrAdmitterContract: the engine.Admitter answered AllowAll with a
	// binding index outside the requests it was given. Answered with 500.
	ErrAdmitterContract = errors.New("httplimit: the admitter broke its contract")
)

// Errors returned by Settle (see its list).
var (
	// ErrNotSettleable: the request did not pass through a Middleware with
	// WithCost or WithKeys, so it has no estimate to settle.
	ErrNotSettleable = errors.New("httplimit: the request has no estimate to settle")
	// ErrNegativeActual: Settle was given an actual cost below 0.
	ErrNegativeActual = errors.New("httplimit: actual cost below 0")
	// ErrNotTaken: the middleware let the request through without taking
	// its cost (WithShadow, a store's failure rule): there is nothing to
	// settle.
	ErrNotTaken = errors.New("httplimit: the request's cost was not taken")
	// ErrUnevenEstimate: under WithKeys, the request's keys were given
	// different costs, so no one difference settles them.
	ErrUnevenEstimate = errors.New("httplimit: the request's keys were given different costs")
	// ErrSettled: Settle was called for the request already.
	ErrSettled = errors.New("httplimit: the request was settled already")
)
