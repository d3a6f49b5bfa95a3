package clock

import "time"

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

// WallClock is what a Clock may also do: tell the wall-clock time. Readings
// of Now have an arbitrary origin per process, so a snapshot restored by
// another process measures the time between the two with the wall clock.
// A Clock without it is taken to run on time.Now's wall clock.
type WallClock interface {
	Wall() time.Time
}

// Wall returns c's wall-clock time: c.Wall() if c is a WallClock, else
// time.Now().
func Wall(c Clock) time.Time {
	if w, ok := c.(WallClock); ok {
		return w.Wall()
	}
	return time.Now()
}

// Until is time.Until; it exists so that only package clock reads the time.
func Until(t time.Time) time.Duration { return time.Until(t) }

// In is the wall-clock instant d from now, as a context deadline is: for
// code outside package clock, which does not read the time itself.
func In(d time.Duration) time.Time { return time.Now().Add(d) }

// Sleeper is what a Clock may also do: signal when its reading has moved on
// by d, for Engine.Wait. Without it, Wait sleeps on real timers.
type Sleeper interface {
	// After returns a channel closed once the reading reaches Now()+d, and
	// a stop function that releases the wait early: after stop, the channel
	// may never close, and the clock keeps nothing for it.
	After(d time.Duration) (<-chan struct{}, func())
}

// Alarm is what a Clock may also do: signal when its reading reaches an
// instant t, however far it moves between a caller's reading and the call.
// Engine.Wait uses it to wake at the instant a denial's estimate names,
// counted from the reading the denial was decided at; a Sleeper without it
// is asked for After(t - Now()), which wakes late by any step the clock
// takes between that Now and After's own reading.
type Alarm interface {
	// At returns a channel closed once the reading reaches t (at once if it
	// has), and a stop function as After's.
	At(t int64) (<-chan struct{}, func())
}
