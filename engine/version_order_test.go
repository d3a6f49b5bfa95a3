package engine_test

// Concurrency tests: the key bound under concurrent creation and eviction,
// one winner among racing cutovers, real-time version order, done contexts,
// Close racing everything, and callers blocked on a full mailbox. Workers
// report through channels; only the test goroutine calls require/assert.
// Nothing sleeps: Manual clocks are driven by hand, and goroutines are
// synchronised with channels, WaitGroups and synctest.Wait.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// ccCall is one call's place in the logical time line: the sequence number
// taken at invocation and at response, and the version it saw.
type ccCall struct {
	start, end, version int64
}

// TestVersionOrderIsRealTime: Allow calls on many keys over 16 shards run
// while 50 cutovers happen. With a shared atomic counter as a logical
// clock: if A responded before B was invoked, B.Version >=
// A.Version; every call invoked after ReplacePolicy returned sees at least
// its version, and no call that responded before ReplacePolicy was invoked
// sees it.
func TestVersionOrderIsRealTime(t *testing.T) {
	const (
		workers   = 8
		minCalls  = 300
		cutovers  = 50
		keySpace  = 1000
		shardsUse = 16
	)
	seed := ccSeed(t)
	e, clk := newEngine(t, engine.Config{Policy: pol(1, 50, 100), Shards: shardsUse})
	ctx := context.Background()
	var seq atomic.Int64

	type workerOut struct {
		calls    []ccCall
		problems []string
	}
	outs := make(chan workerOut, workers)
	start, cutoversDone := make(chan struct{}), make(chan struct{})
	// Workers tick every few calls; the driver waits for ticks before each
	// cutover, so the cutovers are spread over the calls instead of racing
	// ahead of them.
	ticks := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			var out workerOut
			<-start
			for i := 0; ; i++ {
				if i >= minCalls {
					select {
					case <-cutoversDone:
						outs <- out
						return
					default:
					}
				}
				if i%8 == 0 {
					select {
					case ticks <- struct{}{}:
					default:
					}
				}
				key := fmt.Sprintf("key-%d", rng.IntN(keySpace))
				s := seq.Add(1)
				d, err := e.Allow(ctx, key, 1)
				end := seq.Add(1)
				if err != nil {
					out.problems = append(out.problems, fmt.Sprintf("Allow(%s): %v", key, err))
					continue
				}
				out.calls = append(out.calls, ccCall{start: s, end: end, version: d.Version})
			}
		}()
	}

	type replaceOut struct {
		reps []ccCall
		err  error
	}
	replaced := make(chan replaceOut, 1)
	go func() {
		defer close(cutoversDone)
		rng := rand.New(rand.NewPCG(seed, 1<<32))
		var ro replaceOut
		<-start
		for v := int64(2); v <= cutovers+1; v++ {
			for range 4 {
				<-ticks
			}
			clk.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
			next := pol(v, 1+rng.Int64N(100), 1+rng.Int64N(1000))
			s := seq.Add(1)
			err := e.ReplacePolicy(ctx, next, v-1)
			end := seq.Add(1)
			if err != nil {
				ro.err = fmt.Errorf("ReplacePolicy to version %d: %w", v, err)
				break
			}
			ro.reps = append(ro.reps, ccCall{start: s, end: end, version: v})
		}
		replaced <- ro
	}()
	close(start)
	ccWait(t, &wg, "Allow workers")
	ro := <-replaced
	require.NoError(t, ro.err, "seed %d", seed)
	require.Len(t, ro.reps, cutovers)

	var calls []ccCall
	for range workers {
		out := <-outs
		for _, p := range out.problems {
			t.Errorf("seed %d: %s", seed, p)
		}
		calls = append(calls, out.calls...)
	}
	seen := map[int64]bool{}
	for _, c := range calls {
		seen[c.version] = true
	}
	t.Logf("%d calls across %d cutovers saw %d distinct versions", len(calls), cutovers, len(seen))
	require.Greater(t, len(seen), cutovers/2, "seed %d: the calls did not overlap the cutovers", seed)

	// Pairs: sweep the calls in invocation order, folding in every call that
	// responded before the current one was invoked.
	byStart := slices.Clone(calls)
	slices.SortFunc(byStart, func(a, b ccCall) int { return int(a.start - b.start) })
	byEnd := slices.Clone(calls)
	slices.SortFunc(byEnd, func(a, b ccCall) int { return int(a.end - b.end) })
	var (
		j          int
		maxBefore  ccCall
		violations int
		first      string
	)
	for _, b := range byStart {
		for j < len(byEnd) && byEnd[j].end < b.start {
			if byEnd[j].version > maxBefore.version {
				maxBefore = byEnd[j]
			}
			j++
		}
		if b.version < maxBefore.version {
			if violations == 0 {
				first = fmt.Sprintf("call %+v responded before call %+v was invoked", maxBefore, b)
			}
			violations++
		}
	}
	require.Zero(t, violations, "seed %d: %d calls saw an older version than an earlier call; first: %s", seed, violations, first)

	for _, r := range ro.reps {
		for _, c := range calls {
			if c.start > r.end && c.version < r.version {
				t.Fatalf("seed %d: call %+v invoked after ReplacePolicy to version %d returned (seq %d) saw version %d",
					seed, c, r.version, r.end, c.version)
			}
			if c.end < r.start && c.version >= r.version {
				t.Fatalf("seed %d: call %+v responded before ReplacePolicy to version %d was invoked (seq %d) but saw it",
					seed, c, r.version, r.start)
			}
		}
	}
}
