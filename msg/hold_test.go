package msg

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAnswersWaitsForEveryPart: one Answers, reused round after round as a
// caller reuses it, each round expecting parts that answer at once, during
// the caller's yields or once it has parked, and some never sent (Expect
// with a negative count): Wait returns only once every sent part has
// answered, and never misses the last one.
func TestAnswersWaitsForEveryPart(t *testing.T) {
	for _, procs := range []int{1, 2} {
		for _, yields := range []int{0, 1, 5} {
			func() {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				a := NewAnswers()
				for round := range 200 {
					parts, unsent := 1+round%5, round%3
					a.Expect(parts + unsent)
					var answered atomic.Int64
					var wg sync.WaitGroup
					for p := range parts {
						wg.Go(func() {
							for range (p + round) % 7 { // some answer at once, some late
								runtime.Gosched()
							}
							answered.Add(1)
							a.Answer()
						})
					}
					a.Expect(-unsent)
					waited := make(chan struct{})
					go func() { a.Wait(yields); close(waited) }()
					select {
					case <-waited:
					case <-time.After(10 * time.Second): // a bound on a hang, not a wait for success
						t.Fatalf("procs %d, yields %d, round %d: an answer was lost", procs, yields, round)
					}
					require.Equal(t, int64(parts), answered.Load(), "procs %d, yields %d, round %d: Wait returned early", procs, yields, round)
					wg.Wait()
				}
			}()
		}
	}
}
