package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// plainAdmitter hides every method of the engine it wraps but Admitter's,
// so the middleware finds no ReclaimAfter, whatever *engine.Engine offers.
type plainAdmitter struct{ engine.Admitter }

// reclaimingAdmitter is an engine with a ReclaimAfter that answers after
// and ok, and counts its calls.
type reclaimingAdmitter struct {
	engine.Admitter
	after time.Duration
	ok    bool
	calls atomic.Int64
}

func (a *reclaimingAdmitter) ReclaimAfter() (time.Duration, bool) {
	a.calls.Add(1)
	return a.after, a.ok
}

// overloaded returns the Retry-After values of the 503 a second user gets
// from h on an engine with room for one key.
func overloaded(t *testing.T, h http.Handler) []string {
	t.Helper()
	require.Equal(t, http.StatusOK, send(h, "192.0.2.1:1", "/", "X-User", "alice"))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-User", "bob")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Empty(t, rec.Header().Values("RateLimit"))
	return rec.Header().Values("Retry-After")
}

// The 503 for a full key table says when a slot can next be free only when
// someone knows: WithOverloadRetryAfter, else the engine's ReclaimAfter
// rounded up to whole seconds and at least 1, else nothing.
func TestKeyCapacityRetryAfter(t *testing.T) {
	for _, c := range []struct {
		name   string
		after  time.Duration
		ok     bool
		opts   []httplimit.Option
		want   []string
		called bool
	}{
		{"estimate rounds up", 1500 * time.Millisecond, true, nil, []string{"2"}, true},
		{"whole seconds stay", 3 * time.Second, true, nil, []string{"3"}, true},
		{"a slot free now is 1", 0, true, nil, []string{"1"}, true},
		{"one ns is 1", 1, true, nil, []string{"1"}, true},
		{"no background reclamation", 5 * time.Second, false, nil, nil, true},
		{"the option wins", 1500 * time.Millisecond, true, []httplimit.Option{httplimit.WithOverloadRetryAfter(10 * time.Second)}, []string{"10"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
			a := &reclaimingAdmitter{Admitter: e, after: c.after, ok: c.ok}
			h := limited(t, a, append(c.opts, httplimit.WithKey(userKey))...)
			assert.Equal(t, c.want, overloaded(t, h))
			assert.Equal(t, c.called, a.calls.Load() > 0, "ReclaimAfter called")
		})
	}
	t.Run("no ReclaimAfter", func(t *testing.T) {
		e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
		h := limited(t, plainAdmitter{e}, httplimit.WithKey(userKey))
		assert.Empty(t, overloaded(t, h))
	})
	t.Run("no ReclaimAfter, the option", func(t *testing.T) {
		e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
		h := limited(t, plainAdmitter{e}, httplimit.WithKey(userKey), httplimit.WithOverloadRetryAfter(time.Second))
		assert.Equal(t, []string{"1"}, overloaded(t, h))
	})
}

// The engine's own estimate: with background sweeps it offers one, a
// whole number of seconds of at least 1 (its value is the engine's to
// test); with none, as on a Manual clock by default, it offers none.
func TestKeyCapacityRetryAfterFromEngine(t *testing.T) {
	if _, ok := any((*engine.Engine)(nil)).(interface{ ReclaimAfter() (time.Duration, bool) }); !ok {
		t.Skip("*engine.Engine has no ReclaimAfter")
	}
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1, SweepEvery: time.Hour})
	got := overloaded(t, limited(t, e, httplimit.WithKey(userKey)))
	require.Len(t, got, 1)
	s, err := strconv.Atoi(got[0])
	require.NoError(t, err)
	assert.GreaterOrEqual(t, s, 1)

	e, _ = newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
	assert.Empty(t, overloaded(t, limited(t, e, httplimit.WithKey(userKey))))
}

// A closed engine gets no Retry-After from ReclaimAfter, which says when a
// key slot frees up, not when the engine comes back.
func TestClosedIgnoresReclaimAfter(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	a := &reclaimingAdmitter{Admitter: e, after: time.Second, ok: true}
	h := limited(t, a)
	require.NoError(t, e.Close())
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Empty(t, rec.Header().Values("Retry-After"))
	assert.Zero(t, a.calls.Load())
}
