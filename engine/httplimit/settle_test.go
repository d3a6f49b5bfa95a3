package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// settleErrs names the errors of Settle for a response header.
var settleErrs = []struct {
	err  error
	name string
}{
	{httplimit.ErrNotSettleable, "not-settleable"},
	{httplimit.ErrNegativeActual, "negative"},
	{httplimit.ErrNotTaken, "not-taken"},
	{httplimit.ErrUnevenEstimate, "uneven"},
	{httplimit.ErrSettled, "settled"},
}

func settleName(err error) string {
	if err == nil {
		return "ok"
	}
	for _, e := range settleErrs {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return "other: " + err.Error()
}

// settling is a handler that settles its request once for each Actual
// header line, in order, and answers the outcomes in its Settled header
// lines.
var settling = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	for _, v := range r.Header.Values("Actual") {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Add("Settled", settleName(httplimit.Settle(r, n)))
	}
})

// balance is key's balance in whole tokens, read without changing it.
func balance(t *testing.T, e *engine.Engine, key string) int64 {
	t.Helper()
	d, err := e.Peek(t.Context(), key)
	require.NoError(t, err)
	return d.Remaining
}

// An under-estimate is charged into debt, which the key's next request
// repays: with 10 tokens at 1 a second, an estimate of 4 settled at 16
// leaves -6, a request of 1 is denied with Retry-After 7 exactly, and
// admitted at 7 s with nothing left. An over-estimate is given back.
func TestSettleChargeAndRefund(t *testing.T) {
	e, clk := newEngine(t, engine.Config{Policy: pol(10, 1)})
	srv := serve(t, e, settling, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))

	res := get(t, srv, "X-User", "u", "Cost", "4", "Actual", "16")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, []string{"ok"}, res.header.Values("Settled"))
	assert.Equal(t, `"default";r=6;t=4`, res.header.Get("RateLimit"), "the fields describe the estimate's take")
	assert.Equal(t, int64(-6), balance(t, e, "u"))

	res = get(t, srv, "X-User", "u", "Cost", "1")
	require.Equal(t, http.StatusTooManyRequests, res.status)
	assert.Equal(t, "7", res.header.Get("Retry-After"), "6 tokens of debt and the 1 asked for, at 1 a second")
	assert.Equal(t, `"default";r=0;t=7`, res.header.Get("RateLimit"))

	clk.Set(int64(6999 * time.Millisecond))
	require.Equal(t, http.StatusTooManyRequests, get(t, srv, "X-User", "u", "Cost", "1").status, "a millisecond early")
	clk.Set(int64(7 * time.Second))
	res = get(t, srv, "X-User", "u", "Cost", "1")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, `"default";r=0;t=10`, res.header.Get("RateLimit"))

	// An over-estimate: 8 taken, 3 used, 5 given back.
	res = get(t, srv, "X-User", "v", "Cost", "8", "Actual", "3")
	require.Equal(t, []string{"ok"}, res.header.Values("Settled"))
	assert.Equal(t, int64(7), balance(t, e, "v"))
	// Exact: nothing changes.
	res = get(t, srv, "X-User", "w", "Cost", "5", "Actual", "5")
	require.Equal(t, []string{"ok"}, res.header.Values("Settled"))
	assert.Equal(t, int64(5), balance(t, e, "w"))
	// Actual 0: the whole estimate comes back.
	res = get(t, srv, "X-User", "x", "Cost", "5", "Actual", "0")
	require.Equal(t, []string{"ok"}, res.header.Values("Settled"))
	assert.Equal(t, int64(10), balance(t, e, "x"))
	// The floor: one bucket of debt at most, the rest forgiven.
	res = get(t, srv, "X-User", "y", "Cost", "1", "Actual", "100")
	require.Equal(t, []string{"ok"}, res.header.Values("Settled"))
	assert.Equal(t, int64(-10), balance(t, e, "y"))
}

// A request is settled once: a second call is ErrSettled and changes
// nothing, and so is a call after one that failed for a negative actual,
// which did not count.
func TestSettleOnce(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	srv := serve(t, e, settling, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))

	res := get(t, srv, "X-User", "u", "Cost", "2", "Actual", "5", "Actual", "9", "Actual", "0")
	assert.Equal(t, []string{"ok", "settled", "settled"}, res.header.Values("Settled"))
	assert.Equal(t, int64(5), balance(t, e, "u"), "10 - 2, then 3 more charged once")

	res = get(t, srv, "X-User", "v", "Cost", "2", "Actual", "-1", "Actual", "1", "Actual", "1")
	assert.Equal(t, []string{"negative", "ok", "settled"}, res.header.Values("Settled"))
	assert.Equal(t, int64(9), balance(t, e, "v"))
}

// Settling from several goroutines at once settles once.
func TestSettleConcurrent(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(100, 1)})
	var oks, settled int
	h := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				err := httplimit.Settle(r, 11)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					oks++
				case errors.Is(err, httplimit.ErrSettled):
					settled++
				}
			})
		}
		wg.Wait()
	})
	srv := serve(t, e, h, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))
	require.Equal(t, http.StatusOK, get(t, srv, "X-User", "u", "Cost", "1").status)
	assert.Equal(t, 1, oks)
	assert.Equal(t, 7, settled)
	assert.Equal(t, int64(89), balance(t, e, "u"))
}

// Outside a middleware that took an estimate, Settle is
// ErrNotSettleable and charges nothing: a request built by hand, and one
// through a middleware of the default cost; and a nil request.
func TestSettleOutside(t *testing.T) {
	require.ErrorIs(t, httplimit.Settle(nil, 5), httplimit.ErrNotSettleable)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	require.ErrorIs(t, httplimit.Settle(r, 5), httplimit.ErrNotSettleable)
	require.ErrorIs(t, httplimit.Settle(r, -1), httplimit.ErrNotSettleable, "no estimate comes first")

	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	srv := serve(t, e, settling, httplimit.WithKey(userKey))
	res := get(t, srv, "X-User", "u", "Actual", "5")
	assert.Equal(t, []string{"not-settleable"}, res.header.Values("Settled"))
	assert.Equal(t, int64(9), balance(t, e, "u"))
}

// Under WithKeys every key is settled by the same difference: keys given
// 3 each (org's as 2 + 1), settled at 10, are charged 7 each; settled at
// 1, given 2 each. Keys given different costs are ErrUnevenEstimate, and
// nothing is settled.
func TestSettleKeys(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(20, 1)})
	keys := httplimit.WithKeys(func(r *http.Request, _ string) ([]engine.Request, error) {
		user := r.Header.Get("X-User")
		if r.Header.Get("Uneven") != "" {
			return []engine.Request{{Key: user, Cost: 3}, {Key: "org", Cost: 2}}, nil
		}
		return []engine.Request{{Key: user, Cost: 3}, {Key: "org", Cost: 2}, {Key: "org", Cost: 1}}, nil
	})
	srv := serve(t, e, settling, keys)

	res := get(t, srv, "X-User", "a", "Actual", "10")
	require.Equal(t, []string{"ok"}, res.header.Values("Settled"))
	assert.Equal(t, int64(10), balance(t, e, "a"), "20 - 3 - 7")
	assert.Equal(t, int64(10), balance(t, e, "org"), "20 - 3 - 7, charged once though given twice")

	res = get(t, srv, "X-User", "b", "Actual", "1")
	require.Equal(t, []string{"ok"}, res.header.Values("Settled"))
	assert.Equal(t, int64(19), balance(t, e, "b"), "20 - 3 + 2")
	assert.Equal(t, int64(9), balance(t, e, "org"), "10 - 3 + 2")

	res = get(t, srv, "X-User", "c", "Uneven", "1", "Actual", "9", "Actual", "9")
	require.Equal(t, []string{"uneven", "settled"}, res.header.Values("Settled"))
	assert.Equal(t, int64(17), balance(t, e, "c"))
	assert.Equal(t, int64(7), balance(t, e, "org"))
}

// Under WithShadow a request admitted took its cost as under enforcement
// and is settled so; one the limit would have denied took nothing and
// would not have run, so Settle is ErrNotTaken and charges nothing.
func TestSettleShadow(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	srv := serve(t, e, settling, httplimit.WithKey(userKey), httplimit.WithCost(costHeader), httplimit.WithShadow())

	res := get(t, srv, "X-User", "u", "Cost", "4", "Actual", "12")
	require.Equal(t, []string{"ok"}, res.header.Values("Settled"))
	assert.Equal(t, int64(-2), balance(t, e, "u"))

	res = get(t, srv, "X-User", "u", "Cost", "1", "Actual", "5")
	require.Equal(t, http.StatusOK, res.status, "shadow: let through")
	assert.Equal(t, `"default";r=0;t=3`, res.header.Get("RateLimit"))
	assert.Equal(t, []string{"not-taken"}, res.header.Values("Settled"))
	assert.Equal(t, int64(-2), balance(t, e, "u"))

	// Not decided at all (a cost below 1): let through, nothing taken.
	res = get(t, srv, "X-User", "u", "Cost", "0", "Actual", "5")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, []string{"not-taken"}, res.header.Values("Settled"))
	assert.Equal(t, int64(-2), balance(t, e, "u"))
}

// A request a store's failure rule admitted consulted no bucket: Settle is
// ErrNotTaken and never calls the admitter (whose Charge and Refund would
// panic here).
func TestSettleDegraded(t *testing.T) {
	a := degradedAdmitter{d: engine.Decision{Degraded: true, Allowed: true, Version: 1, Limit: 10}}
	mw, err := httplimit.New(a, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(settling))
	t.Cleanup(srv.Close)
	res := get(t, srv, "X-User", "u", "Cost", "2", "Actual", "7")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, []string{"not-taken"}, res.header.Values("Settled"))

	// A denial by the failure rule, let through by a shadow middleware.
	a.d = engine.Decision{Degraded: true, RetryAfter: time.Second, Version: 1, Limit: 10}
	mw, err = httplimit.New(a, httplimit.WithKey(userKey), httplimit.WithCost(costHeader), httplimit.WithShadow())
	require.NoError(t, err)
	shadow := httptest.NewServer(mw.Handler(settling))
	t.Cleanup(shadow.Close)
	res = get(t, shadow, "X-User", "u", "Cost", "2", "Actual", "7")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, []string{"not-taken"}, res.header.Values("Settled"))
}

// Settle still settles when the request's context has ended: a client
// that hangs up before its usage is known still pays for it.
func TestSettleAfterCancel(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	mw, err := httplimit.New(e, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var settled error
	h := mw.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		cancel()
		<-r.Context().Done()
		settled = httplimit.Settle(r, 9)
	}))
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	r.Header.Set("X-User", "u")
	r.Header.Set("Cost", "1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code)
	require.NoError(t, settled)
	assert.Equal(t, int64(1), balance(t, e, "u"))
}

// Behind two middlewares that took estimates, Settle settles both, each
// by its own estimate; a second call is ErrSettled for both.
func TestSettleNested(t *testing.T) {
	outerE, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	innerE, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	outer, err := httplimit.New(outerE, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))
	require.NoError(t, err)
	inner, err := httplimit.New(innerE, httplimit.WithKey(userKey), httplimit.WithCost(func(*http.Request) int64 { return 1 }),
		httplimit.WithShadow(), httplimit.WithPolicyName("candidate"))
	require.NoError(t, err)
	srv := httptest.NewServer(outer.Handler(inner.Handler(settling)))
	t.Cleanup(srv.Close)
	res := get(t, srv, "X-User", "u", "Cost", "3", "Actual", "6", "Actual", "6")
	require.Equal(t, []string{"ok", "settled"}, res.header.Values("Settled"))
	assert.Equal(t, int64(4), balance(t, outerE, "u"), "10 - 3 - 3")
	assert.Equal(t, int64(4), balance(t, innerE, "u"), "10 - 1 - 5")
}

// Behind an enforcing middleware, a shadow one that would have denied the
// request took nothing, but the enforcing one took its estimate: Settle
// settles that one and is not ErrNotTaken, which says nothing was charged
// (nor, joined to it, would it hide a real error of the enforcing one from
// a handler that takes ErrNotTaken as benign). A second call is
// ErrSettled. Behind middlewares none of which took a cost, it is
// ErrNotTaken.
func TestSettleNestedShadowWouldDeny(t *testing.T) {
	outerE, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	innerE, _ := newEngine(t, engine.Config{Policy: pol(3, 1)})
	outer, err := httplimit.New(outerE, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))
	require.NoError(t, err)
	inner, err := httplimit.New(innerE, httplimit.WithKey(userKey), httplimit.WithCost(costHeader),
		httplimit.WithShadow(), httplimit.WithPolicyName("candidate"))
	require.NoError(t, err)
	srv := httptest.NewServer(outer.Handler(inner.Handler(settling)))
	t.Cleanup(srv.Close)

	res := get(t, srv, "X-User", "u", "Cost", "2")
	require.Equal(t, `"default";r=8;t=2, "candidate";r=1;t=2`, res.header.Get("RateLimit"))
	res = get(t, srv, "X-User", "u", "Cost", "2", "Actual", "1", "Actual", "1")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, `"default";r=6;t=4, "candidate";r=1;t=1`, res.header.Get("RateLimit"), "the candidate would deny")
	assert.Equal(t, []string{"ok", "settled"}, res.header.Values("Settled"))
	assert.Equal(t, int64(7), balance(t, outerE, "u"), "10 - 2 - 2 + 1")
	assert.Equal(t, int64(1), balance(t, innerE, "u"), "nothing taken")

	// Both shadow, both would deny: nothing was taken anywhere.
	a, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	b, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	sa, err := httplimit.New(a, httplimit.WithKey(userKey), httplimit.WithCost(costHeader), httplimit.WithShadow())
	require.NoError(t, err)
	sb, err := httplimit.New(b, httplimit.WithKey(userKey), httplimit.WithCost(costHeader), httplimit.WithShadow())
	require.NoError(t, err)
	both := httptest.NewServer(sa.Handler(sb.Handler(settling)))
	t.Cleanup(both.Close)
	res = get(t, both, "X-User", "u", "Cost", "2", "Actual", "5", "Actual", "5")
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, []string{"not-taken", "not-taken"}, res.header.Values("Settled"))
	assert.Equal(t, int64(1), balance(t, a, "u"))
	assert.Equal(t, int64(1), balance(t, b, "u"))
}

// chargeLost is an engine whose Charge the store's failure rule answers, as
// a Redis store's does once Redis is gone after the request was admitted:
// allowed, marked Degraded, with a nil error, and nothing known taken.
type chargeLost struct{ *engine.Engine }

func (chargeLost) Charge(context.Context, string, int64) (engine.Decision, error) {
	return engine.Decision{Allowed: true, Degraded: true, Version: 1, Limit: 10}, nil
}

// A request a bucket admitted, whose Settle's charge the store's failure
// rule answers (Redis gone meanwhile), is not settled as far as anyone
// knows: Settle says so with ErrDegraded, as it says a Refund that Redis
// did not answer, rather than nil; it is still settled once.
func TestSettleChargeDegraded(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	mw, err := httplimit.New(chargeLost{e}, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))
	require.NoError(t, err)
	var errs []error
	h := mw.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		errs = append(errs, httplimit.Settle(r, 7), httplimit.Settle(r, 7))
	}))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-User", "u")
	r.Header.Set("Cost", "2")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code)
	require.Len(t, errs, 2)
	assert.ErrorIs(t, errs[0], httplimit.ErrDegraded)
	assert.ErrorContains(t, errs[0], `"u"`)
	assert.ErrorIs(t, errs[1], httplimit.ErrSettled)
	assert.Equal(t, int64(8), balance(t, e, "u"), "the estimate, taken by the bucket")
}
