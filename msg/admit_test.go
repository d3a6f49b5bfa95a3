package msg

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAwaitPartReturnsEveryPart: whether a part's number is in the buffer
// before the wait, arrives during its yields or only once it blocks, every
// number comes back exactly once.
func TestAwaitPartReturnsEveryPart(t *testing.T) {
	for _, procs := range []int{1, 2} {
		for _, yields := range []int{0, 1, 5} {
			func() {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				const parts = 64
				done := make(chan int, parts)
				done <- 0 // answered before the wait begins
				var wg sync.WaitGroup
				for p := 1; p < parts; p++ {
					wg.Go(func() {
						for range p % 7 { // some answer at once, some late
							runtime.Gosched()
						}
						done <- p
					})
				}
				// A lost number would block the last wait for good: a
				// watchdog turns that into a failure.
				got := make(chan int)
				go func() {
					for range parts {
						got <- AwaitPart(done, yields)
					}
				}()
				seen := make([]bool, parts)
				for range parts {
					select {
					case p := <-got:
						require.False(t, seen[p], "procs %d, yields %d: part %d returned twice", procs, yields, p)
						seen[p] = true
					case <-time.After(10 * time.Second):
						t.Fatalf("procs %d, yields %d: a part was lost", procs, yields)
					}
				}
				wg.Wait()
				require.Empty(t, done, "procs %d, yields %d", procs, yields)
			}()
		}
	}
}
