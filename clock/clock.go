package clock

// Clock is a source of time in nanoseconds since the clock's origin.
//
// Now must return a value >= 0 and should never go backwards; the engine
// answers a backward step with engine.ErrClockRegression rather than trusting
// it. Implementations must be safe for concurrent use. Clock has exactly one
// method on purpose: anything more a clock can do (timers, say) is an optional
// interface the engine looks for by type assertion, so a one-method Clock
// written by a user keeps working.
type Clock interface {
	Now() int64
}
