package expvarstats_test

import (
	"context"
	"encoding/json"
	"expvar"
	"fmt"
	"io"
	"log"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/expvarstats"
	"github.com/tokenshard/tokenshard/policy"
)

// runs makes every name fresh: expvar names live as long as the process,
// and -count reruns the tests in one.
var runs atomic.Int64

func freshName(t *testing.T) string {
	return fmt.Sprintf("tokenshard_expvarstats_%s_%d", t.Name(), runs.Add(1))
}

func newEngine(t *testing.T) *engine.Engine {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1},
		Shards: 2, Clock: clock.NewManual(0),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// read returns the Stats published under name, decoded from expvar's JSON.
func read(t *testing.T, name string) engine.Stats {
	t.Helper()
	v := expvar.Get(name)
	require.NotNil(t, v, "nothing published under %q", name)
	var st engine.Stats
	require.NoError(t, json.Unmarshal([]byte(v.String()), &st))
	return st
}

// TestPublish: the variable is the engine's Stats as of each read, not of
// Publish, and keeps answering after Close with the final counts.
func TestPublish(t *testing.T) {
	e := newEngine(t)
	name := freshName(t)
	require.NoError(t, expvarstats.Publish(name, e))
	st := read(t, name)
	assert.Len(t, st.Shards, 2)
	assert.Zero(t, st.Total.Allowed)

	ctx := context.Background()
	for range 3 {
		_, err := e.Allow(ctx, "k", 2)
		require.NoError(t, err)
	}
	require.NoError(t, e.Close()) // the counts are final once closed
	st = read(t, name)
	assert.Equal(t, uint64(2), st.Total.Allowed)
	assert.Equal(t, uint64(1), st.Total.Denied)
	assert.Equal(t, e.Stats(), st)
}

// TestPublishNameTaken: a name already published, by this package or by
// anyone, is ErrInvalidConfig, and what it names stays as it was.
func TestPublishNameTaken(t *testing.T) {
	first, second := newEngine(t), newEngine(t)
	name := freshName(t)
	require.NoError(t, expvarstats.Publish(name, first))
	_, err := first.Allow(context.Background(), "k", 1)
	require.NoError(t, err)
	require.NoError(t, first.Close())

	assert.ErrorIs(t, expvarstats.Publish(name, second), engine.ErrInvalidConfig)
	assert.Equal(t, uint64(1), read(t, name).Total.Allowed, "the name still reports the first engine")

	other := freshName(t)
	expvar.NewInt(other)
	assert.ErrorIs(t, expvarstats.Publish(other, second), engine.ErrInvalidConfig)
	assert.IsType(t, new(expvar.Int), expvar.Get(other))
}

// TestPublishUninitialized: a nil or zero Engine publishes nothing.
func TestPublishUninitialized(t *testing.T) {
	for what, e := range map[string]*engine.Engine{"nil": nil, "zero": new(engine.Engine)} {
		name := freshName(t)
		assert.ErrorIs(t, expvarstats.Publish(name, e), engine.ErrNotInitialized, what)
		assert.Nil(t, expvar.Get(name), what)
	}
}

// TestPublishConcurrent: of many Publish calls racing for one name exactly
// one succeeds, and none panics (expvar.Publish panics on a name taken).
func TestPublishConcurrent(t *testing.T) {
	e := newEngine(t)
	name := freshName(t)
	var ok atomic.Int32
	done := make(chan struct{})
	const callers = 8
	for range callers {
		go func() {
			defer func() { done <- struct{}{} }()
			if expvarstats.Publish(name, e) == nil {
				ok.Add(1)
			}
		}()
	}
	for range callers {
		<-done
	}
	assert.Equal(t, int32(1), ok.Load())
}

// TestPublishRacingAnotherPublisher: a name another package publishes with
// expvar.Publish at the same moment is still an error, never a panic:
// expvar.Publish panics on a name taken, and Publish's check and publish
// are one step only among Publish's own callers. Each round races one
// expvar.Publish against one Publish for a fresh name; the window between
// check and publish is narrow, so it takes many rounds to meet it.
func TestPublishRacingAnotherPublisher(t *testing.T) {
	e := newEngine(t)
	prev := log.Writer()
	log.SetOutput(io.Discard) // expvar logs each name taken before it panics
	t.Cleanup(func() { log.SetOutput(prev) })
	const rounds = 10000
	var panics, published, refused int
	for range rounds {
		name := freshName(t)
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			defer func() { _ = recover() }() // expvar's own panic, when Publish won
			<-start
			expvar.Publish(name, new(expvar.Int))
		})
		var err error
		var p any
		wg.Go(func() {
			defer func() { p = recover() }()
			<-start
			err = expvarstats.Publish(name, e)
		})
		close(start)
		wg.Wait()
		switch {
		case p != nil:
			panics++
		case err == nil:
			published++
		default:
			require.ErrorIs(t, err, engine.ErrInvalidConfig)
			refused++
		}
	}
	t.Logf("published %d, refused %d, panicked %d", published, refused, panics)
	assert.Zero(t, panics, "Publish panicked on a name published meanwhile")
}
