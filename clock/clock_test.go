package clock_test

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/clock"
)

// TestMain fails the package if a test leaves a goroutine behind; the
// concurrency tests below start many. No goroutine is ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Both clocks implement the one-method interface.
var (
	_ clock.Clock = (*clock.Manual)(nil)
	_ clock.Clock = (*clock.Monotonic)(nil)
)

// panicValue runs f and returns what it panicked with, or nil.
func panicValue(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

// requirePanics fails unless f panics with a message that starts with the
// package prefix and mentions want.
func requirePanics(t *testing.T, want string, f func()) {
	t.Helper()
	v := panicValue(f)
	require.NotNil(t, v, "expected a panic")
	msg := fmt.Sprint(v)
	require.Contains(t, msg, "clock: ")
	require.Contains(t, msg, want)
}

func TestManualStartsAtStart(t *testing.T) {
	for _, start := range []int64{0, 1, int64(time.Hour), math.MaxInt64} {
		m := clock.NewManual(start)
		require.Equal(t, start, m.Now())
		require.Equal(t, start, m.Now(), "reading does not move by itself")
	}
}

func TestManualZeroValue(t *testing.T) {
	var m clock.Manual
	require.Zero(t, m.Now())
	m.Advance(time.Second)
	require.Equal(t, int64(time.Second), m.Now())
	m.Set(5 * int64(time.Second))
	require.Equal(t, 5*int64(time.Second), m.Now())
}

func TestNewManualNegativePanics(t *testing.T) {
	requirePanics(t, "-1", func() { clock.NewManual(-1) })
	requirePanics(t, fmt.Sprint(int64(math.MinInt64)), func() { clock.NewManual(math.MinInt64) })
}

func TestManualSet(t *testing.T) {
	m := clock.NewManual(100)
	m.Set(100) // the current reading: allowed, changes nothing
	require.Equal(t, int64(100), m.Now())
	m.Set(250)
	require.Equal(t, int64(250), m.Now())
	m.Set(math.MaxInt64)
	require.Equal(t, int64(math.MaxInt64), m.Now())
}

func TestManualSetBackwardsPanics(t *testing.T) {
	m := clock.NewManual(500)
	requirePanics(t, "499", func() { m.Set(499) })
	require.Equal(t, int64(500), m.Now(), "a refused Set leaves the reading alone")
	requirePanics(t, "500", func() { m.Set(0) })
	requirePanics(t, "before", func() { m.Set(-1) })
	require.Equal(t, int64(500), m.Now())

	m.Set(math.MaxInt64)
	requirePanics(t, "before", func() { m.Set(math.MaxInt64 - 1) })
	require.Equal(t, int64(math.MaxInt64), m.Now())
}

func TestManualAdvance(t *testing.T) {
	m := clock.NewManual(10)
	m.Advance(0)
	require.Equal(t, int64(10), m.Now())
	m.Advance(1)
	require.Equal(t, int64(11), m.Now())
	m.Advance(time.Second)
	require.Equal(t, int64(11+time.Second), m.Now())
	m.Advance(250 * time.Millisecond)
	require.Equal(t, int64(11+1250*time.Millisecond), m.Now())
}

func TestManualAdvanceNegativePanics(t *testing.T) {
	m := clock.NewManual(10)
	requirePanics(t, "negative", func() { m.Advance(-1) })
	requirePanics(t, "negative", func() { m.Advance(math.MinInt64) })
	require.Equal(t, int64(10), m.Now(), "a refused Advance leaves the reading alone")
}

func TestManualAdvanceSaturates(t *testing.T) {
	m := clock.NewManual(math.MaxInt64 - 5)
	m.Advance(5)
	require.Equal(t, int64(math.MaxInt64), m.Now(), "reaching MaxInt64 exactly")

	m = clock.NewManual(math.MaxInt64 - 5)
	m.Advance(10)
	require.Equal(t, int64(math.MaxInt64), m.Now(), "past MaxInt64 saturates")
	m.Advance(1)
	require.Equal(t, int64(math.MaxInt64), m.Now(), "at MaxInt64 it stays")
	m.Advance(math.MaxInt64)
	require.Equal(t, int64(math.MaxInt64), m.Now())

	m = clock.NewManual(1)
	m.Advance(math.MaxInt64)
	require.Equal(t, int64(math.MaxInt64), m.Now())
	m.Set(math.MaxInt64) // still the current reading: allowed
}

// TestManualConcurrentAdvance: many goroutines advancing at once lose no
// step, and every reader sees a reading that never goes backwards.
func TestManualConcurrentAdvance(t *testing.T) {
	const (
		writers = 8
		steps   = 20_000
		readers = 1 // few spinning readers, so the writers get the CPUs and collide
		start   = int64(1_000)
	)
	m := clock.NewManual(start)
	errs := make(chan error, readers)
	done := make(chan struct{})
	// Writers wait for one signal, so they really overlap instead of each
	// finishing before the next is scheduled.
	begin := make(chan struct{})

	var readersWG sync.WaitGroup
	for range readers {
		readersWG.Go(func() { errs <- readMonotonic(m, done) })
	}
	var writersWG sync.WaitGroup
	for w := range writers {
		writersWG.Go(func() {
			<-begin
			for i := range steps {
				// Steps of 1 and 2 ns, so the total checks the sizes
				// as well as the count of steps that landed.
				m.Advance(time.Duration(1 + (w+i)%2))
			}
		})
	}
	close(begin)
	writersWG.Wait()
	close(done)
	readersWG.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	want := start
	for w := range writers {
		for i := range steps {
			want += int64(1 + (w+i)%2)
		}
	}
	require.Equal(t, want, m.Now())
}

// TestManualConcurrentSetAndAdvance runs rounds: in each round many
// goroutines Set the same target at once (never a step back, so it never
// panics), then many Advance; readers check the reading never decreases
// throughout. The final reading is known exactly.
func TestManualConcurrentSetAndAdvance(t *testing.T) {
	const (
		goroutines = 16
		rounds     = 50
		stride     = int64(1_000_000) // > goroutines * largest step, so each Set moves forward
		readers    = 4
	)
	m := clock.NewManual(0)
	errs := make(chan error, readers+(goroutines+2)*rounds)
	done := make(chan struct{})

	var readersWG sync.WaitGroup
	for range readers {
		readersWG.Go(func() { errs <- readMonotonic(m, done) })
	}

	for r := range rounds {
		target := int64(r+1) * stride
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				if v := panicValue(func() { m.Set(target) }); v != nil {
					errs <- fmt.Errorf("round %d: Set(%d) panicked: %v", r, target, v)
				}
			})
		}
		wg.Wait()
		if got := m.Now(); got != target {
			errs <- fmt.Errorf("round %d: after Set(%d) read %d", r, target, got)
		}
		for g := range goroutines {
			wg.Go(func() { m.Advance(time.Duration(g + 1)) })
		}
		wg.Wait()
		if want, got := target+goroutines*(goroutines+1)/2, m.Now(); got != want {
			errs <- fmt.Errorf("round %d: after Advance read %d, want %d", r, got, want)
		}
	}
	close(done)
	readersWG.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	require.Equal(t, int64(rounds)*stride+goroutines*(goroutines+1)/2, m.Now())
}

// TestManualConcurrentAdvanceSaturates: concurrent steps past MaxInt64 all
// saturate; none wraps negative.
func TestManualConcurrentAdvanceSaturates(t *testing.T) {
	m := clock.NewManual(math.MaxInt64 - 1_000)
	errs := make(chan error, 1)
	done := make(chan struct{})
	var readerWG sync.WaitGroup
	readerWG.Go(func() { errs <- readMonotonic(m, done) })
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				m.Advance(math.MaxInt64 / 3)
			}
		})
	}
	wg.Wait()
	close(done)
	readerWG.Wait()
	require.NoError(t, <-errs)
	require.Equal(t, int64(math.MaxInt64), m.Now())
}

// readMonotonic reads c until done is closed and reports the first reading
// that is negative or earlier than the one before it. It reads at least
// once after done is closed, so it always ends on the final value too.
func readMonotonic(c clock.Clock, done <-chan struct{}) error {
	prev := c.Now()
	for n := 0; ; n++ {
		select {
		case <-done:
			return check(prev, c.Now(), n)
		default:
		}
		cur := c.Now()
		if err := check(prev, cur, n); err != nil {
			return err
		}
		prev = cur
	}
}

func check(prev, cur int64, n int) error {
	if cur < 0 {
		return fmt.Errorf("read %d: negative reading %d", n, cur)
	}
	if cur < prev {
		return fmt.Errorf("read %d: reading went back from %d to %d", n, prev, cur)
	}
	return nil
}

// TestMonotonicStartsNearZero: the origin is construction, so the first
// reading is at least 0 and at most the time that passed around the call,
// measured independently. No wall-clock bound is assumed.
func TestMonotonicStartsNearZero(t *testing.T) {
	before := time.Now()
	c := clock.NewMonotonic()
	first := c.Now()
	elapsed := time.Since(before)
	require.GreaterOrEqual(t, first, int64(0))
	require.LessOrEqual(t, first, int64(elapsed), "the origin is at construction, not earlier")
}

func TestMonotonicNeverDecreases(t *testing.T) {
	c := clock.NewMonotonic()
	prev := c.Now()
	require.GreaterOrEqual(t, prev, int64(0))
	for i := range 200_000 {
		cur := c.Now()
		require.NoError(t, check(prev, cur, i))
		prev = cur
	}
}

func TestMonotonicConcurrentReads(t *testing.T) {
	c := clock.NewMonotonic()
	const readers = 8
	errs := make(chan error, readers)
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() {
			prev := c.Now()
			for i := range 20_000 {
				cur := c.Now()
				if err := check(prev, cur, i); err != nil {
					errs <- err
					return
				}
				prev = cur
			}
			errs <- nil
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestMonotonicIndependentOrigins: each clock counts from its own
// construction, so a clock made later reads no more than one made earlier.
func TestMonotonicIndependentOrigins(t *testing.T) {
	older := clock.NewMonotonic()
	newer := clock.NewMonotonic()
	n := newer.Now()
	o := older.Now()
	require.LessOrEqual(t, n, o)
}

// TestMonotonicZeroValue: a zero Monotonic is a working clock, counting
// from when package clock was initialized (so from before this test began),
// not one stuck at math.MaxInt64, under which no bucket would ever refill.
func TestMonotonicZeroValue(t *testing.T) {
	var c clock.Monotonic
	before := time.Now()
	first := c.Now()
	require.GreaterOrEqual(t, first, int64(0))
	require.Less(t, first, int64(math.MaxInt64/2), "the zero value's origin is the package's start, not the year 1")
	for c.Now() == first { // time passes for the zero value too
		require.Less(t, time.Since(before), 10*time.Second, "a zero Monotonic never moved")
	}
	newer := clock.NewMonotonic()
	require.LessOrEqual(t, newer.Now(), c.Now(), "the zero value counts from before any NewMonotonic here")
}

// ExampleManual drives time by hand, as engine tests do: nothing moves until
// the test says so, so every reading is known.
func ExampleManual() {
	c := clock.NewManual(0)
	fmt.Println(c.Now())

	c.Advance(500 * time.Millisecond)
	fmt.Println(c.Now())

	c.Set(int64(2 * time.Second))
	fmt.Println(time.Duration(c.Now()))

	c.Advance(math.MaxInt64) // saturates rather than wrapping
	fmt.Println(c.Now() == math.MaxInt64)
	// Output:
	// 0
	// 500000000
	// 2s
	// true
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestManualAfter: After's channel closes exactly when the reading reaches
// Now()+d, by Set or Advance, at once for d <= 0, and each channel once.
func TestManualAfter(t *testing.T) {
	m := clock.NewManual(100)
	after := func(d time.Duration) <-chan struct{} {
		ch, _ := m.After(d)
		return ch
	}
	assert.True(t, closed(after(0)))
	assert.True(t, closed(after(-5)))
	a, b := after(10), after(20)
	m.Set(109)
	assert.False(t, closed(a))
	m.Advance(1) // 110
	assert.True(t, closed(a))
	assert.False(t, closed(b))
	m.Set(1000)
	assert.True(t, closed(b))
	assert.True(t, closed(after(math.MinInt64)))
	c := after(math.MaxInt64) // saturates: closes only at the end of time
	m.Set(math.MaxInt64 - 1)
	assert.False(t, closed(c))
	m.Advance(1)
	assert.True(t, closed(c))
	assert.Zero(t, m.Waiting())
}

// TestManualAt: At's channel closes exactly when the reading reaches t, at
// once for a t it has reached, whatever the reading was when the caller
// chose t; its stop forgets the wait.
func TestManualAt(t *testing.T) {
	var _ clock.Alarm = (*clock.Manual)(nil)
	m := clock.NewManual(100)
	past, _ := m.At(40)
	now, _ := m.At(100)
	assert.True(t, closed(past))
	assert.True(t, closed(now))
	a, _ := m.At(150) // chosen at 100; the clock moves on before the wait
	b, stopB := m.At(150)
	m.Set(149)
	assert.False(t, closed(a))
	stopB()
	m.Advance(1)
	assert.True(t, closed(a))
	assert.False(t, closed(b), "a stopped wait fired")
	end, _ := m.At(math.MaxInt64)
	m.Set(math.MaxInt64)
	assert.True(t, closed(end))
	assert.Zero(t, m.Waiting())
}

// TestManualAfterStop: a stopped wait is forgotten and never fires; stopping
// one that fired, or twice, is harmless.
func TestManualAfterStop(t *testing.T) {
	m := clock.NewManual(0)
	ch1, stop1 := m.After(10)
	ch2, stop2 := m.After(10)
	assert.Equal(t, 2, m.Waiting())
	stop1()
	stop1()
	assert.Equal(t, 1, m.Waiting())
	m.Advance(10)
	select {
	case <-ch1:
		t.Fatal("a stopped wait fired")
	default:
	}
	<-ch2
	stop2()
	assert.Zero(t, m.Waiting())
}

// TestManualAfterConcurrent: After and Set from many goroutines: every
// channel whose time has come is closed, none is closed twice (that would
// panic), and the race detector is quiet.
func TestManualAfterConcurrent(t *testing.T) {
	m := clock.NewManual(0)
	var wg sync.WaitGroup
	chans := make([][]<-chan struct{}, 4)
	for g := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				ch, stop := m.After(time.Duration(i % 50))
				if i%7 == 0 {
					stop()
					continue
				}
				chans[g] = append(chans[g], ch)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 1000 {
			m.Advance(1)
		}
	}()
	wg.Wait()
	m.Advance(100) // everything registered is now due
	for _, cs := range chans {
		for _, ch := range cs {
			<-ch
		}
	}
	assert.Zero(t, m.Waiting())
}

// TestWall: Manual's wall time is the epoch plus its reading; Monotonic's
// is the real one; a Clock with neither falls back to time.Now.
func TestWall(t *testing.T) {
	assert.Equal(t, time.Unix(0, 5e9), clock.Wall(clock.NewManual(5e9)))
	before := time.Now()
	w := clock.Wall(clock.NewMonotonic())
	assert.False(t, w.Before(before))
	w = clock.Wall(oneMethod{})
	assert.False(t, w.Before(before))
}

type oneMethod struct{}

func (oneMethod) Now() int64 { return 0 }
