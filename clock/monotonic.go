package clock

import "time"

// Monotonic reads Go's monotonic clock relative to its construction, never the
// wall clock, so stepping the system time changes nothing. It is safe for
// concurrent use and may be copied. The zero value reports time since the zero
// time.Time, which is not monotonic: use NewMonotonic.
type Monotonic struct {
	origin time.Time // carries the monotonic reading taken by NewMonotonic
}

// NewMonotonic returns a Monotonic whose origin is now.
func NewMonotonic() *Monotonic {
	return &Monotonic{origin: time.Now()}
}

// Now returns the nanoseconds elapsed since the Monotonic was created.
func (m *Monotonic) Now() int64 {
	// time.Since subtracts monotonic readings, so the result never goes
	// backwards and starts at zero.
	return int64(time.Since(m.origin))
}

// Wall returns time.Now().
func (m *Monotonic) Wall() time.Time { return time.Now() }
