package policy

import (
	"fmt"
	"math"
	"time"
)

// Limiter is the algorithm behind one key, with time as a parameter.
// TokenBucket, FixedWindow and SlidingLog implement it: standalone limiters
// for one key each, for users who want one of them and for comparing the
// three. The engine does not use Limiter; it stays a token-bucket engine.
//
// TryAcquire admits cost at now if it fits, and answers with an Outcome:
//
//   - Allowed reports whether cost was admitted.
//   - Remaining is the cost that could still be admitted at now, after the
//     decision (whole tokens, for TokenBucket).
//   - RetryAfter is 0 when allowed; otherwise the ns from now until cost
//     would fit, if nothing else is admitted meanwhile. It is an estimate,
//     not a reservation.
//   - ResetAfter is the ns from now until the full capacity is available
//     again, if nothing else is admitted meanwhile; 0 when it already is.
//
// Each type says exactly how it computes them.
//
// A cost below 1 or above the capacity can never be admitted: it is denied
// with RetryAfter math.MaxInt64, meaning never, and admits nothing (Remaining
// and ResetAfter still describe the limiter at now). math.MaxInt64 is also
// where a TokenBucket estimate too long for int64 saturates, a wait of over
// 292 years: either way it means do not retry.
//
// Times are int64 nanoseconds of one clock, from any origin, such as
// clock.Clock readings; they are >= 0. A limiter keeps the latest reading it
// has been given, and treats an earlier one (a clock stepped back, or two
// readings taken in one order and delivered in the other) as that latest
// reading. A FixedWindow or SlidingLog starts having seen 0, a TokenBucket
// the reading it was made at, so a negative reading is never used. Nothing
// panics, whatever the arguments.
//
// A Limiter is not safe for concurrent use. Like a Bucket, it has one owner,
// who serializes the calls: one goroutine, or a mutex around each call.
type Limiter interface {
	TryAcquire(now, cost int64) Outcome
}

// never is RetryAfter for a cost that can never be admitted.
const never = math.MaxInt64

var (
	_ Limiter = (*TokenBucket)(nil)
	_ Limiter = (*FixedWindow)(nil)
	_ Limiter = (*SlidingLog)(nil)
)

// TokenBucket is a Limiter that holds up to Capacity tokens, refilled
// continuously at the Limit's rate: exactly the arithmetic the engine uses
// for every key (Bucket.Decide, or Level for a period too long for a
// Bucket), behind the Limiter contract. A burst of Capacity passes at once,
// and then the rate on average, at any alignment. It answers with Decide's
// Outcome: Remaining is the whole tokens left, RetryAfter the time until the
// balance holds cost, ResetAfter the time until it is full again, both
// rounded up and saturated at math.MaxInt64.
//
// Make one with NewTokenBucket. It is not safe for concurrent use (see
// Limiter). The zero value admits nothing: its capacity is 0, so every cost
// is above it. A copy is a separate limiter with the same balance.
type TokenBucket struct {
	limit Limit
	level Level
	last  int64 // the latest reading seen
}

// NewTokenBucket returns a full TokenBucket for l at the reading now. It
// returns an error wrapping ErrInvalid that names the bad field for a
// Capacity below 1, a rate that is missing, doubly set or below 1 (as
// Policy.Validate judges one), or a now below 0.
func NewTokenBucket(l Limit, now int64) (*TokenBucket, error) {
	if err := l.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, err)
	}
	if now < 0 {
		return nil, fmt.Errorf("%w: now %d, want >= 0", ErrInvalid, now)
	}
	return &TokenBucket{limit: l, level: FullLevel(l), last: now}, nil
}

// TryAcquire brings the bucket up to now and takes cost tokens if it holds
// them, as Bucket.Decide does. A now before the latest reading is taken as
// that reading; a cost outside [1, Capacity] is denied with RetryAfter
// math.MaxInt64 (see Limiter). It does not allocate.
func (tb *TokenBucket) TryAcquire(now, cost int64) Outcome {
	now = max(now, tb.last)
	tb.level.Refill(tb.limit, now-tb.last)
	tb.last = now
	if cost < 1 || cost > tb.limit.Capacity {
		return Outcome{Remaining: tb.level.Tokens, RetryAfter: never, ResetAfter: tb.level.ResetAfter(tb.limit)}
	}
	o := Outcome{Allowed: tb.level.Tokens >= cost}
	if o.Allowed {
		tb.level.Tokens -= cost
	} else {
		o.RetryAfter = tb.level.RetryAfter(tb.limit, cost)
	}
	o.Remaining = tb.level.Tokens
	o.ResetAfter = tb.level.ResetAfter(tb.limit)
	return o
}

// FixedWindow is a Limiter that counts the cost admitted in each window,
// the windows aligned at multiples of the window length from time 0:
// [k*window, (k+1)*window). It admits cost if the window's count plus cost
// is at most the capacity, and forgets the count when the next window
// starts.
//
// It is the cheapest of the three (a few integers of state) and the coarsest:
// by contract it lets up to 2*capacity through in any span shorter than a
// window that straddles a boundary, capacity at the end of one window and
// capacity again at the start of the next.
//
// Its Outcome: Remaining is capacity minus the window's count; RetryAfter,
// when denied, is the time until the next window starts (every valid cost
// fits in an empty window); ResetAfter is that same time if the window has
// counted anything, else 0.
//
// Make one with NewFixedWindow. It is not safe for concurrent use (see
// Limiter). The zero value admits nothing: its capacity is 0. A copy is a
// separate limiter with the same count.
type FixedWindow struct {
	capacity int64
	window   int64 // ns, >= 1
	last     int64 // the latest reading seen; 0 before the first
	start    int64 // the start of the window count belongs to; meaningless when count is 0
	count    int64 // cost admitted since start; 0 <= count <= capacity
}

// NewFixedWindow returns a FixedWindow that admits up to capacity per window,
// with nothing counted yet. It returns an error wrapping ErrInvalid that
// names the bad field for a capacity below 1 or a window below 1ns.
func NewFixedWindow(capacity int64, window time.Duration) (*FixedWindow, error) {
	if err := validateWindowed(capacity, window); err != nil {
		return nil, err
	}
	return &FixedWindow{capacity: capacity, window: int64(window)}, nil
}

// TryAcquire admits cost at now if it fits in now's window. A now before
// the latest reading is taken as that reading; a cost outside [1, capacity]
// is denied with RetryAfter math.MaxInt64 (see Limiter). It does not
// allocate.
func (w *FixedWindow) TryAcquire(now, cost int64) Outcome {
	now = max(now, w.last)
	w.last = now
	// start <= now, so the subtraction cannot overflow, and the end of the
	// window, start+window, which might, is never computed.
	if now-w.start >= w.window {
		w.count = 0
	}
	o := Outcome{Allowed: cost >= 1 && cost <= w.capacity-w.count}
	switch {
	case o.Allowed:
		if w.count == 0 { // now may be in a later window than start
			w.start = now - now%w.window
		}
		w.count += cost
	case cost < 1 || cost > w.capacity:
		o.RetryAfter = never
	default: // count > 0, so start is now's window
		o.RetryAfter = w.window - (now - w.start)
	}
	o.Remaining = w.capacity - w.count
	if w.count > 0 {
		o.ResetAfter = w.window - (now - w.start)
	}
	return o
}

// SlidingLog is a Limiter over an exact rolling window: it admits cost at t
// if the cost it admitted in (t-window, t], plus cost, is at most the
// capacity. So no span of one window ever sees more than capacity admitted,
// wherever it starts.
//
// It keeps a log of its admissions, one entry of 16 bytes per distinct
// instant at which it admitted something, and drops entries as they leave
// the window. Its memory is proportional to the admissions within one window
// (at most capacity entries), not to its history: the log's array is
// replaced by a smaller one once it is at most a quarter full, so a burst
// does not pin memory after it has passed. TryAcquire allocates only to grow
// or shrink the log.
//
// Its Outcome: Remaining is capacity minus the cost admitted in
// (now-window, now]; RetryAfter, when denied, is the exact time until enough
// of that cost leaves the window for cost to fit; ResetAfter is the time
// until all of it has left, 0 if there is none. An admission at t leaves at
// t+window; if that is past math.MaxInt64, the instant now+RetryAfter is not
// representable either, and never arrives.
//
// Make one with NewSlidingLog. It is not safe for concurrent use (see
// Limiter). The zero value admits nothing: its capacity is 0. It must not be
// copied after first use: a copy shares the log's array.
type SlidingLog struct {
	capacity int64
	window   int64      // ns, >= 1
	last     int64      // the latest reading seen; 0 before the first
	log      []logEntry // admissions, oldest first; log[head:] are in the window
	head     int
	// Running totals of the cost ever admitted and of the cost that has
	// left the window, both modulo 2^64: their difference, the cost in the
	// window, is at most capacity, so it is exact even after they wrap.
	total, left uint64
}

// logEntry is the admissions at one instant. It records the running total
// after them rather than their cost, so the cost of any run of entries is a
// subtraction and RetryAfter is a binary search.
type logEntry struct {
	at    int64
	total uint64 // SlidingLog.total just after the admissions at at
}

// minLogCap is the smallest array SlidingLog shrinks its log to, so a limiter
// that admits a little now and then does not reallocate every time.
const minLogCap = 16

// NewSlidingLog returns a SlidingLog that admits up to capacity in any
// window, with nothing admitted yet. It returns an error wrapping ErrInvalid
// that names the bad field for a capacity below 1 or a window below 1ns.
func NewSlidingLog(capacity int64, window time.Duration) (*SlidingLog, error) {
	if err := validateWindowed(capacity, window); err != nil {
		return nil, err
	}
	return &SlidingLog{capacity: capacity, window: int64(window)}, nil
}

// TryAcquire drops the admissions that left the window by now, and admits
// cost if it fits with those that remain. A now before the latest reading is
// taken as that reading; a cost outside [1, capacity] is denied with
// RetryAfter math.MaxInt64 (see Limiter).
func (s *SlidingLog) TryAcquire(now, cost int64) Outcome {
	now = max(now, s.last)
	s.last = now
	s.expire(now)
	inWindow := int64(s.total - s.left) // <= capacity
	o := Outcome{Allowed: cost >= 1 && cost <= s.capacity-inWindow}
	switch {
	case o.Allowed:
		s.total += uint64(cost)
		if n := len(s.log); n > s.head && s.log[n-1].at == now {
			s.log[n-1].total = s.total // one entry per instant
		} else {
			s.log = append(s.log, logEntry{at: now, total: s.total})
		}
		inWindow += cost
	case cost < 1 || cost > s.capacity:
		o.RetryAfter = never
	default:
		// Some entries must leave: those up to the first whose running
		// total, counted from the window's start, reaches the excess. The
		// excess is >= 1, and the last entry's count, inWindow, reaches it.
		excess := uint64(inWindow - (s.capacity - cost))
		lo, hi := s.head, len(s.log)-1
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if s.log[mid].total-s.left >= excess {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		o.RetryAfter = s.untilLeaves(now, lo)
	}
	o.Remaining = s.capacity - inWindow
	if len(s.log) > s.head {
		o.ResetAfter = s.untilLeaves(now, len(s.log)-1)
	}
	return o
}

// untilLeaves returns the ns from now until log[i], which is in the window,
// leaves it: at+window-now, computed as window-(now-at) because 0 <= now-at
// < window while at+window may overflow.
func (s *SlidingLog) untilLeaves(now int64, i int) int64 {
	return s.window - (now - s.log[i].at)
}

// expire drops the entries at or before now-window (no overflow: now >= 0)
// and compacts the log if any left.
func (s *SlidingLog) expire(now int64) {
	from := s.head
	for s.head < len(s.log) && s.log[s.head].at <= now-s.window {
		s.left = s.log[s.head].total
		s.head++
	}
	if s.head == from {
		return
	}
	live := len(s.log) - s.head
	switch {
	case cap(s.log) > minLogCap && live <= cap(s.log)/4:
		// Shrink to a new array, so the old, mostly empty one can be freed.
		// The log has lost at least half of what it held since its array
		// was made, which pays for copying what is left.
		next := make([]logEntry, live, max(2*live, minLogCap))
		copy(next, s.log[s.head:])
		s.log, s.head = next, 0
	case s.head >= live:
		// Slide what is left to the front, so appends reuse the array; it
		// is no more than was just dropped, which pays for the copy.
		s.log, s.head = s.log[:copy(s.log, s.log[s.head:])], 0
	}
}

// validateWindowed checks the arguments of NewFixedWindow and NewSlidingLog.
func validateWindowed(capacity int64, window time.Duration) error {
	switch {
	case capacity < 1:
		return fmt.Errorf("%w: capacity %d, want >= 1", ErrInvalid, capacity)
	case window < 1:
		return fmt.Errorf("%w: window %v, want >= 1ns", ErrInvalid, window)
	}
	return nil
}
