package yield

import (
	"runtime"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLocalRunsOthers: on one processor, a goroutine made runnable before
// a yield runs before the yielder resumes. Three yields, not one: the
// scheduler serves the global queue first one time in 61, where Gosched
// (-tags purego) puts the yielder, and a GC may preempt the other
// goroutine before it stores.
func TestLocalRunsOthers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var ran atomic.Bool
	done := make(chan struct{})
	go func() {
		ran.Store(true)
		close(done)
	}()
	for i := 0; i < 3 && !ran.Load(); i++ {
		Local()
	}
	if !ran.Load() {
		t.Error("the other goroutine did not run during three yields")
	}
	<-done
}
