package yield

import (
	"runtime"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLocalRunsOthers: on one processor, a goroutine made runnable before
// the yield runs before the yielder resumes.
func TestLocalRunsOthers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var ran atomic.Bool
	done := make(chan struct{})
	go func() {
		ran.Store(true)
		close(done)
	}()
	Local()
	if !ran.Load() {
		t.Error("the other goroutine did not run during the yield")
	}
	<-done
}
