package msg

import (
	"runtime"
	"sync"
	"testing"

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
				seen := make([]bool, parts)
				for range parts {
					p := AwaitPart(done, yields)
					require.False(t, seen[p], "procs %d, yields %d: part %d returned twice", procs, yields, p)
					seen[p] = true
				}
				wg.Wait()
				require.Empty(t, done, "procs %d, yields %d", procs, yields)
			}()
		}
	}
}
