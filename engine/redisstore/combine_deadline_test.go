package redisstore_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestCombinedCallOutlivesAnEarlierDeadline: a combined call runs until
// the latest deadline of its callers, so a caller whose deadline is later
// than another's gets Redis's answer when Redis answers in time for it,
// not the failure rule's: the earlier deadline ends only its own caller's
// wait. Redis holds the call (pauseWrites) until the earlier deadline has
// passed, and answers it well within the later.
func TestCombinedCallOutlivesAnEarlierDeadline(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	needPauseWrite(t, c)
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1},
		Timeout: 10 * time.Second}, clock.NewManual(0))
	release := make(chan struct{})
	paused := make(chan error, 1)
	var unpause func() // set before paused is sent
	var once sync.Once
	redisstore.SetCombineHook(s, func(point string) {
		switch point {
		case redisstore.HookAlone:
			<-release
		case redisstore.HookTaken: // the batch of both callers, before it is sent
			once.Do(func() {
				var err error
				unpause, err = pauseWrites(t, c)
				paused <- err
			})
		}
	})
	bg := context.Background()
	errs := make(chan error, 2)
	for _, key := range []string{"x", "y"} { // two calls in flight: the next requests queue
		go func() { _, err := s.Allow(bg, key, 1); errs <- err }()
	}
	for q, f := redisstore.Queued(s, "k"); q != 0 || f != 2; q, f = redisstore.Queued(s, "k") {
		runtime.Gosched()
	}
	type answer struct {
		d   engine.Decision
		err error
	}
	short, long := make(chan answer, 1), make(chan answer, 1)
	for _, w := range []struct {
		wait time.Duration
		out  chan answer
	}{{300 * time.Millisecond, short}, {8 * time.Second, long}} {
		go func() {
			ctx, cancel := context.WithTimeout(bg, w.wait)
			defer cancel()
			d, err := s.Allow(ctx, "k", 1)
			w.out <- answer{d, err}
		}()
	}
	for q, _ := redisstore.Queued(s, "k"); q != 2; q, _ = redisstore.Queued(s, "k") {
		runtime.Gosched()
	}
	close(release)
	require.NoError(t, <-paused)
	a := <-short
	require.NoError(t, a.err)
	require.True(t, a.d.Degraded, "the short caller's deadline passed during the pause: %+v", a.d)
	unpause() // the calls on x and y may be held too
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	a = <-long
	require.NoError(t, a.err)
	require.False(t, a.d.Degraded, "Redis answered within the later deadline: %+v", a.d)
	require.True(t, a.d.Allowed)
}
