package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/shard"
)

// Background reclamation: a sweep every period (Config.SweepEvery), and a
// pressure sweep soon after a new key finds the key table full. Both evict
// full buckets only, like EvictFull, and go through the coordinator, so they
// never overlap a cutover, EvictFull or each other.
const (
	// DefaultSweepEvery is the background sweep period when Config.SweepEvery
	// is 0 and the clock is the real one. It is long because pressure sweeps
	// reclaim at once when the table is full: the periodic sweep only returns
	// the memory of idle keys. It is measured on the clock and noticed by the
	// shards as they decide requests, with no timer: a runtime timer makes
	// every goroutine switch read the clock, and a single Allow is one.
	DefaultSweepEvery = time.Minute
	// PressureSweepGap is the least time between the starts of two pressure
	// sweeps. A pressure sweep also waits until nine times the last one's
	// duration has passed since it ended, so under a flood of new keys that
	// never stops, sweeping takes at most a tenth of the time; and a sweep
	// that evicted nothing waits until the first bucket it kept is full,
	// since no earlier sweep could evict anything, unless a cutover or a
	// refund, which can fill buckets sooner, comes meanwhile: then it waits
	// PressureSweepGap from that at most, or for the spacing above if that
	// is longer; or new keys the sweep did not see take the table's last
	// free slot: then it waits only for the spacing above. Durations are
	// the engine clock's: a clock that jumps forward while a sweep runs
	// counts the jump as the sweep's duration, and puts the next pressure
	// sweep off by nine times it (periodic sweeps keep their period).
	PressureSweepGap = 250 * time.Millisecond
)

// reclaimer is the engine's background sweeper: its period, whether new keys
// meeting the bound trigger pressure sweeps, and the pressure schedule.
type reclaimer struct {
	every    time.Duration // 0: no background sweep at all
	pressure bool
	// alarm, for the default period, rings when a shard's reading passes
	// the next sweep's time; with an explicit SweepEvery (nil alarm) a real
	// ticker keeps the period, as documented.
	alarm *shard.Alarm

	// next is the clock reading before which no pressure sweep starts, and
	// took the duration of the last one: ReclaimAfter reads them. A
	// pressure sweep sets them, under the coordinator; a cutover or a
	// refund brings next forward (sooner), never back.
	next, took atomic.Int64
	// base is next without the wait for the first bucket kept to be full:
	// the spacing alone (see PressureSweepGap).
	base atomic.Int64
	kick chan struct{} // one slot: next moved earlier
	// sooner is set when a cutover or a refund may have filled buckets
	// sooner than the sweep in progress can see, so that it does not put
	// the next off until the first bucket it kept is full.
	sooner atomic.Bool
}

// configure sets up the background sweeps cfg asks for (cfg has its
// defaults): with SweepEvery 0, a DefaultSweepEvery period and pressure
// sweeps on the real clock, and nothing on any other; with SweepEvery > 0,
// both on any clock; with SweepEvery < 0, nothing.
func (r *reclaimer) configure(cfg Config) {
	r.kick = make(chan struct{}, 1)
	switch _, isReal := cfg.Clock.(*clock.Monotonic); {
	case cfg.SweepEvery > 0:
		r.every, r.pressure = cfg.SweepEvery, true
	case cfg.SweepEvery == 0 && isReal:
		r.every, r.pressure = DefaultSweepEvery, true
		r.alarm = shard.NewAlarm()
	}
}

// sweeper runs a sweep every period, and a pressure sweep when the key
// budget signals that a creation failed, as the schedule allows, until
// Close. While a pressure sweep waits for its time, further signals are the
// same signal and are not read; a periodic sweep that frees a slot makes it
// unnecessary, and a cutover (which may fill buckets sooner) brings it
// forward.
func (e *Engine) sweeper() {
	// The periodic sweep waits on the alarm or on a real ticker.
	r := &e.reclaim
	var tick <-chan time.Time
	var alarm <-chan struct{}
	due := int64(0) // with the alarm, the reading the next periodic sweep is due at
	rearm := func() {}
	if r.alarm != nil {
		alarm = r.alarm.C()
		rearm = func() {
			due = satAdd(e.clk.Now(), int64(r.every))
			r.alarm.Set(due)
		}
		rearm()
	} else {
		t := time.NewTicker(r.every)
		defer t.Stop()
		tick = t.C
	}
	pending := false // a pressure sweep waits for its time
	periodic := func() bool {
		evicted, ok := e.background(false)
		rearm()
		pending = pending && evicted == 0 // slots were freed: no need
		return ok
	}
	for {
		full, wait, stop := e.budget.Full(), (<-chan struct{})(nil), func() {}
		filled := e.budget.Filled()
		if pending {
			d := time.Duration(r.next.Load() - e.clk.Now())
			if d <= 0 {
				pending = false
				if _, ok := e.background(true); !ok {
					return
				}
				continue
			}
			full = nil
			wait, stop = e.after(d)
		}
		select {
		case <-e.closing:
			stop()
			return
		case <-tick:
			stop()
			if !periodic() {
				return
			}
		case <-alarm:
			stop()
			if e.clk.Now() < due {
				continue // rung during the last sweep, before it was rearmed
			}
			if !periodic() {
				return
			}
		case <-full:
			pending = r.pressure
		case <-filled:
			stop()
			r.unseen()
		case <-r.kick:
			stop()
		case <-wait:
			stop()
		}
	}
}

// background runs one background sweep and returns what it evicted; a
// pressure sweep also schedules the next. It reports false once Close has
// begun.
func (e *Engine) background(pressure bool) (evicted int, ok bool) {
	if e.acquire(context.Background()) != nil {
		return 0, false // only Close makes acquire fail here
	}
	defer e.release()
	if pressure {
		select { // keys that took the last slot before this sweep are keys it sees
		case <-e.budget.Filled():
		default:
		}
	}
	start := e.clk.Now()
	e.reclaim.sooner.Store(false)
	r, err := e.sweep(context.Background(), pressure)
	if errors.Is(err, ErrClosed) {
		return r.evicted, false
	}
	if err != nil {
		// The shards count what they evicted; a failure is counted here,
		// and the next tick or signal simply tries again.
		e.sweepFailures.Add(1)
	}
	if pressure {
		e.pressureSweeps.Add(1)
		end := e.clk.Now()
		took := max(end-start, 0)
		next := max(satAdd(start, int64(PressureSweepGap)), satAdd(end, 9*took))
		e.reclaim.base.Store(next)
		if r.evicted == 0 && err == nil && !e.reclaim.sooner.Load() {
			// Nothing was freed or refunded: no bucket the sweep saw is
			// full before the first one it kept. Keys it did not see
			// (created in room left, or since) bring the wait back to
			// base once they fill the table (unseen).
			next = max(next, r.soonest)
		}
		if e.pressureHook != nil {
			e.pressureHook()
		}
		e.reclaim.took.Store(took)
		e.reclaim.next.Store(next)
		if e.reclaim.sooner.Load() {
			// A refund since the look above may have found the last
			// schedule and lowered it, not this one: undo the wait for
			// the first bucket kept, as if it had come during the sweep.
			e.reclaim.lower(e.reclaim.base.Load())
		}
	}
	return r.evicted, true
}

// unseen undoes the last pressure sweep's wait for the first bucket it
// kept to be full, keeping its spacing (PressureSweepGap, nine times its
// duration): keys it never saw have taken the table's last free slot, and
// one of their buckets may be full sooner. The sweeper calls it, between
// sweeps.
func (r *reclaimer) unseen() { r.lower(r.base.Load()) }

// lower brings next forward to at, if it is later.
func (r *reclaimer) lower(at int64) {
	for n := r.next.Load(); n > at && !r.next.CompareAndSwap(n, at); n = r.next.Load() {
	}
}

// fillsSooner brings the pressure schedule forward after a cutover or a
// refund, which may make buckets full sooner than the last sweep found: the
// next pressure sweep may start PressureSweepGap after now at the latest,
// or when the last one's spacing (base) ends, if that is later.
func (r *reclaimer) fillsSooner(now int64) {
	if !r.pressure {
		return
	}
	r.sooner.Store(true)
	r.lower(max(satAdd(now, int64(PressureSweepGap)), r.base.Load()))
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// ReclaimAfter estimates how long from now until a key slot can next be
// free when the key table is full (ErrKeyCapacity): until the next pressure
// sweep can end, which is no sooner than the first tracked bucket the last
// one kept is full again, or PressureSweepGap after a cutover or a refund
// since, which can fill buckets sooner, or the spacing alone once keys it
// did not see have filled the table; never before the spacing
// PressureSweepGap describes. ok is false when no background sweep runs
// (Config.SweepEvery), so only EvictFull can free a slot. It is an
// estimate, not a promise: other new keys may take a slot first. It never
// blocks, and answers after Close with the last schedule.
func (e *Engine) ReclaimAfter() (d time.Duration, ok bool) {
	if e == nil || !e.reclaim.pressure {
		return 0, false
	}
	wait := max(e.reclaim.next.Load()-e.clk.Now(), 0)
	return time.Duration(satAdd(wait, e.reclaim.took.Load())), true
}

// after returns a channel closed once d has passed on the engine's clock if
// it is a clock.Sleeper, else on a real timer, and a function that stops
// the wait; the timer leaves nothing behind once stopped or fired.
func (e *Engine) after(d time.Duration) (<-chan struct{}, func()) {
	if s, ok := e.clk.(clock.Sleeper); ok {
		return s.After(d)
	}
	ch := make(chan struct{})
	t := time.AfterFunc(d, func() { close(ch) })
	return ch, func() { t.Stop() }
}
