package clock

import "time"

// Monotonic reads Go's monotonic clock relative to its construction, never the
// wall clock, so stepping the system time changes nothing. It is safe for
// concurrent use and may be copied. Use NewMonotonic; the zero value works
// too, measuring from when package clock was initialized.
type Monotonic struct {
	origin time.Time // carries the monotonic reading taken by NewMonotonic
}

// loaded is the zero Monotonic's origin. Without it a zero origin would
// be the year 1, and time.Since saturates that at math.MaxInt64: a clock
// that never moves, under which no bucket ever refills.
var loaded = time.Now()

// NewMonotonic returns a Monotonic whose origin is now.
func NewMonotonic() *Monotonic {
	return &Monotonic{origin: time.Now()}
}

// Now returns the nanoseconds elapsed since the Monotonic was created (for
// the zero value, since package clock was initialized).
func (m *Monotonic) Now() int64 {
	// time.Since subtracts monotonic readings, so the result never goes
	// backwards and starts at zero.
	if m.origin.IsZero() {
		return int64(time.Since(loaded))
	}
	return int64(time.Since(m.origin))
}

// Wall returns time.Now().
func (m *Monotonic) Wall() time.Time { return time.Now() }
