package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

func mustBands(t *testing.T, bands ...policy.Band) *policy.BandSet {
	t.Helper()
	s, err := policy.NewBands(bands...)
	require.NoError(t, err)
	return s
}

// checkFields sends one request through srv and checks its status and its
// three fields exactly (retryAfter "" for none).
func checkFields(t *testing.T, srv *httptest.Server, status int, policyField, limit, retryAfter string, header ...string) {
	t.Helper()
	res := get(t, srv, header...)
	require.Equal(t, status, res.status)
	assert.Equal(t, []string{policyField}, res.header.Values("RateLimit-Policy"))
	assert.Equal(t, []string{limit}, res.header.Values("RateLimit"))
	if retryAfter == "" {
		assert.Empty(t, res.header.Values("Retry-After"))
	} else {
		assert.Equal(t, []string{retryAfter}, res.header.Values("Retry-After"))
	}
}

// A worked example over HTTP: capacity 5 at 5/s and a band
// "daily" of 20 a day. RateLimit-Policy lists both bands, each with its own
// q and w; RateLimit names the band that bound. 5 pass in each of the first
// 4 seconds, the primary binding (fewest whole tokens, ties to it); at 4 s
// "daily" denies for exactly 4316 s.
func TestBandHeaders(t *testing.T) {
	p := pol(5, 5)
	p.Bands = mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})
	e, clk := newEngine(t, engine.Config{Policy: p})
	srv := serve(t, e, ok)
	const both = `"default";q=5;w=1, "daily";q=20;w=86400`

	for s := range 4 {
		if s > 0 {
			clk.Advance(time.Second)
		}
		for i := range 5 {
			// The primary's tokens left; its ResetAfter is 0.2 s a token.
			left := 4 - i
			checkFields(t, srv, http.StatusOK, both, `"default";r=`+strconv.Itoa(left)+`;t=1`, "")
		}
	}
	clk.Advance(time.Second)
	checkFields(t, srv, http.StatusTooManyRequests, both, `"daily";r=0;t=4316`, "4316")

	clk.Advance(4316*time.Second - 1)
	checkFields(t, srv, http.StatusTooManyRequests, both, `"daily";r=0;t=1`, "1")
	clk.Advance(1)
	// Allowed: "daily" has 0 whole tokens left, fewer than the primary's 4,
	// and is full again in a day.
	checkFields(t, srv, http.StatusOK, both, `"daily";r=0;t=86400`, "")
}

// A band with fewer whole tokens than the primary binds an admitted
// request too, and reports its own r and t.
func TestBandBindsWhenAllowed(t *testing.T) {
	p := pol(10, 10)
	p.Bands = mustBands(t,
		policy.Band{Name: "hourly", Capacity: 3, Refill: policy.PerHour(3)},
		policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(100)},
	)
	e, _ := newEngine(t, engine.Config{Policy: p})
	srv := serve(t, e, ok)
	const all = `"default";q=10;w=1, "hourly";q=3;w=3600, "daily";q=100;w=86400`
	checkFields(t, srv, http.StatusOK, all, `"hourly";r=2;t=1200`, "") // a token in 20 min
	checkFields(t, srv, http.StatusOK, all, `"hourly";r=1;t=2400`, "")
	checkFields(t, srv, http.StatusOK, all, `"hourly";r=0;t=3600`, "")
	checkFields(t, srv, http.StatusTooManyRequests, all, `"hourly";r=0;t=1200`, "1200")
}

// An override's limit is its own: its primary under its Name, then its own
// bands, never the policy's. Decision.Band names the primary by the
// override's Name; the header names it the same.
func TestOverrideBandHeaders(t *testing.T) {
	goldBands := mustBands(t,
		policy.Band{Name: "hourly", Capacity: 100, Refill: policy.PerHour(100)},
		policy.Band{Name: "daily", Capacity: 150, Refill: policy.PerDay(1000)},
	)
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "gold:*", Capacity: 60, TokensPerSecond: 6, Bands: goldBands, Name: "gold"},
		policy.Override{Match: "plain", Capacity: 7, TokensPerSecond: 2},
	)
	require.NoError(t, err)
	p := pol(5, 5)
	p.Bands = mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})
	p.Overrides = set
	e, _ := newEngine(t, engine.Config{Policy: p})
	srv := serve(t, e, ok, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))

	const goldPolicy = `"gold";q=60;w=10, "hourly";q=100;w=3600, "daily";q=150;w=12960`
	d, err := e.Allow(context.Background(), "gold:acme", 1)
	require.NoError(t, err)
	require.Equal(t, "gold", d.Band, "the engine names the primary by the override")
	// 59 left in the primary, 99 hourly, 149 daily: the primary binds.
	checkFields(t, srv, http.StatusOK, goldPolicy, `"gold";r=58;t=1`, "", "X-User", "gold:acme")
	// 50 at once: the primary keeps 8, hourly 48, daily 98.
	checkFields(t, srv, http.StatusOK, goldPolicy, `"gold";r=8;t=9`, "", "X-User", "gold:acme", "Cost", "50")
	// 9 more would leave the primary none: denied, for 1/6 s, by the primary.
	checkFields(t, srv, http.StatusTooManyRequests, goldPolicy, `"gold";r=8;t=1`, "1", "X-User", "gold:acme", "Cost", "9")

	// The policy's own keys get the policy's band; an unnamed override with
	// no bands gets none, under its derived name.
	checkFields(t, srv, http.StatusOK, `"default";q=5;w=1, "daily";q=20;w=86400`, `"default";r=4;t=1`, "", "X-User", "nobody")
	checkFields(t, srv, http.StatusOK, `"default-7-2";q=7;w=4`, `"default-7-2";r=6;t=1`, "", "X-User", "plain")
}

// A Refill policy: capacity 10 at 100 per minute, one token every 600 ms.
// w = ceil(10 x 60 s / 100) = 6; 10 pass at t=0, the 11th waits 600 ms,
// sent as 1 s.
func TestRefillHeaders(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(100)}
	e, clk := newEngine(t, engine.Config{Policy: p})
	srv := serve(t, e, ok)
	const field = `"default";q=10;w=6`
	for i := range 10 {
		// ResetAfter (i+1) x 600 ms, rounded up.
		reset := (int64(i+1)*600 + 999) / 1000
		checkFields(t, srv, http.StatusOK, field, `"default";r=`+strconv.Itoa(9-i)+`;t=`+strconv.FormatInt(reset, 10), "")
	}
	d, err := e.Peek(context.Background(), loopback)
	require.NoError(t, err)
	require.Equal(t, 600*time.Millisecond, d.RetryAfter, "exactly 600 ms")
	checkFields(t, srv, http.StatusTooManyRequests, field, `"default";r=0;t=1`, "1")
	clk.Advance(600*time.Millisecond - 1)
	checkFields(t, srv, http.StatusTooManyRequests, field, `"default";r=0;t=1`, "1")
	clk.Advance(1)
	checkFields(t, srv, http.StatusOK, field, `"default";r=0;t=6`, "")
}

// Derived names for overrides of any rate: a rate per second keeps
// today's "P-<capacity>-<tokens>", however it is written; any other period
// adds "/<period>" in its largest whole unit. A Name that is a derived
// name is used only by the quota it names.
func TestRefillQuotaNames(t *testing.T) {
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "minute", Capacity: 10, Refill: policy.PerMinute(100)},
		policy.Override{Match: "seven", Capacity: 10, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second}},
		policy.Override{Match: "day", Capacity: 20, Refill: policy.PerDay(20)},
		policy.Override{Match: "odd", Capacity: 5, Refill: policy.Rate{Tokens: 3, Per: 1500 * time.Millisecond}},
		policy.Override{Match: "tiny", Capacity: 2, Refill: policy.Rate{Tokens: 1, Per: 1}},
		policy.Override{Match: "micro", Capacity: 2, Refill: policy.Rate{Tokens: 1, Per: 2 * time.Microsecond}},
		policy.Override{Match: "longest", Capacity: 1, Refill: policy.Rate{Tokens: 1, Per: 1<<63 - 1}},
		policy.Override{Match: "per-second", Capacity: 7, Refill: policy.PerSecond(2)},                  // "default-7-2", as TokensPerSecond 2
		policy.Override{Match: "as-default", Capacity: 100, Refill: policy.PerSecond(1)},                // the default's quota
		policy.Override{Match: "own", Capacity: 10, Refill: policy.PerHour(5), Name: "default-10-5/1h"}, // its own: kept
		policy.Override{Match: "fake", Capacity: 9, Refill: policy.PerHour(5), Name: "default-10-100/1m"},
		policy.Override{Match: "not-canonical", Capacity: 9, Refill: policy.PerHour(6), Name: "default-9-6/60m"}, // a plain name
		policy.Override{Match: "fake-second", Capacity: 9, Refill: policy.PerHour(7), Name: "default-7-2/1s"},    // a plain name
	)
	require.NoError(t, err)
	p := pol(100, 1)
	p.Overrides = set
	e, _ := newEngine(t, engine.Config{Policy: p})
	h := limited(t, e, httplimit.WithKey(userKey))
	for _, c := range []struct{ user, policy, limit string }{
		{"minute", `"default-10-100/1m";q=10;w=6`, `"default-10-100/1m";r=9;t=1`},
		{"seven", `"default-10-7/3s";q=10;w=5`, `"default-10-7/3s";r=9;t=1`},
		{"day", `"default-20-20/24h";q=20;w=86400`, `"default-20-20/24h";r=19;t=4320`},
		{"odd", `"default-5-3/1500ms";q=5;w=3`, `"default-5-3/1500ms";r=4;t=1`},
		{"tiny", `"default-2-1/1ns";q=2;w=1`, `"default-2-1/1ns";r=1;t=1`},
		{"micro", `"default-2-1/2us";q=2;w=1`, `"default-2-1/2us";r=1;t=1`},
		{"longest", `"default-1-1/9223372036854775807ns";q=1;w=9223372037`, `"default-1-1/9223372036854775807ns";r=0;t=9223372036`}, // t, a wait, is the longest Duration in whole seconds: one more overflows a client that multiplies it by a second
		{"per-second", `"default-7-2";q=7;w=4`, `"default-7-2";r=6;t=1`},
		{"as-default", `"default";q=100;w=100`, `"default";r=99;t=1`},
		{"own", `"default-10-5/1h";q=10;w=7200`, `"default-10-5/1h";r=9;t=720`},
		{"fake", `"default-9-5/1h";q=9;w=6480`, `"default-9-5/1h";r=8;t=720`},
		{"not-canonical", `"default-9-6/60m";q=9;w=5400`, `"default-9-6/60m";r=8;t=600`},
		{"fake-second", `"default-7-2/1s";q=9;w=4629`, `"default-7-2/1s";r=8;t=515`},
	} {
		gotPolicy, gotLimit := quotaHeaders(t, h, c.user)
		assert.Equal(t, c.policy, gotPolicy, "user %q", c.user)
		assert.Equal(t, c.limit, gotLimit, "user %q", c.user)
	}
}

// A band may have the name the primary would answer under (the policy
// name, or a derived name): the primary then takes its derived name, or
// that name and "-1", "-2", so one response never names two bands alike.
func TestBandNameCollisions(t *testing.T) {
	for _, c := range []struct {
		name   string
		bands  []string
		policy string
		limit  string
	}{
		{"band named like the policy", []string{"default"},
			`"default-5-5";q=5;w=1, "default";q=20;w=86400`, `"default-5-5";r=4;t=1`},
		{"and like the derived name", []string{"default", "default-5-5"},
			`"default-5-5-1";q=5;w=1, "default";q=20;w=86400, "default-5-5";q=20;w=86400`, `"default-5-5-1";r=4;t=1`},
		{"and like the first fallback", []string{"default-5-5-1", "default", "default-5-5"},
			`"default-5-5-2";q=5;w=1, "default-5-5-1";q=20;w=86400, "default";q=20;w=86400, "default-5-5";q=20;w=86400`, `"default-5-5-2";r=4;t=1`},
		{"only a derived name taken: P is free", []string{"default-5-5"},
			`"default";q=5;w=1, "default-5-5";q=20;w=86400`, `"default";r=4;t=1`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var bands []policy.Band
			for _, n := range c.bands {
				bands = append(bands, policy.Band{Name: n, Capacity: 20, Refill: policy.PerDay(20)})
			}
			p := pol(5, 5)
			p.Bands = mustBands(t, bands...)
			e, _ := newEngine(t, engine.Config{Policy: p})
			srv := serve(t, e, ok)
			checkFields(t, srv, http.StatusOK, c.policy, c.limit, "")
		})
	}

	// An unnamed override's derived name, taken by one of its bands, and a
	// policy name that needs escaping.
	set, err := policy.NewOverrideSet(policy.Override{Match: loopback, Capacity: 3, Refill: policy.PerMinute(3),
		Bands: mustBands(t, policy.Band{Name: `a"b-3-3/1m`, Capacity: 9, Refill: policy.PerHour(9)})})
	require.NoError(t, err)
	p := pol(5, 5)
	p.Overrides = set
	e, _ := newEngine(t, engine.Config{Policy: p})
	srv := serve(t, e, ok, httplimit.WithPolicyName(`a"b`))
	checkFields(t, srv, http.StatusOK, `"a\"b-3-3/1m-1";q=3;w=60, "a\"b-3-3/1m";q=9;w=3600`, `"a\"b-3-3/1m-1";r=2;t=20`, "")
}

// The fields follow the policy in force: a cutover that adds a band lists
// it from the next request on, full (it only restricts).
func TestBandHeadersFollowCutover(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 5)})
	srv := serve(t, e, ok)
	checkFields(t, srv, http.StatusOK, `"default";q=5;w=1`, `"default";r=4;t=1`, "")
	next := pol(5, 5)
	next.Version = 2
	next.Bands = mustBands(t, policy.Band{Name: "hourly", Capacity: 2, Refill: policy.PerHour(2)})
	require.NoError(t, e.ReplacePolicy(context.Background(), next, 1))
	checkFields(t, srv, http.StatusOK, `"default";q=5;w=1, "hourly";q=2;w=3600`, `"hourly";r=1;t=1800`, "")
}

// nopWriter is a ResponseWriter that keeps its header and drops the rest.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// The middleware's own work per request is two allocations (the fields'
// one string and their values), whatever the number of bands, and under
// WithCost two more for an admitted request (the request that carries its
// estimate to Settle); a denial adds nothing more. The engine itself
// allocates nothing.
func TestHeaderAllocs(t *testing.T) {
	bands := mustBands(t,
		policy.Band{Name: "hourly", Capacity: 1 << 50, Refill: policy.PerHour(1 << 40)},
		policy.Band{Name: "daily", Capacity: 1 << 50, Refill: policy.PerDay(1 << 40)},
		policy.Band{Name: "weekly", Capacity: 1 << 50, Refill: policy.PerDay(1 << 40)},
	)
	set, err := policy.NewOverrideSet(policy.Override{Match: "minute", Capacity: 1 << 50, Refill: policy.PerMinute(1 << 40)})
	require.NoError(t, err)
	many := pol(1<<50, 1<<40)
	many.Bands = bands
	withOverride := pol(1<<50, 1<<40)
	withOverride.Overrides = set
	for _, c := range []struct {
		name string
		p    policy.Policy
		user string
		cost string
	}{
		{"one band", pol(1<<50, 1<<40), "u", "1"},
		{"four bands", many, "u", "1"},
		{"derived Refill name", withOverride, "minute", "1"},
		{"denied, four bands", many, "u", strconv.FormatInt(1<<50, 10)},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: c.p})
			mw, err := httplimit.New(e, httplimit.WithKey(userKey), httplimit.WithCost(costHeader),
				httplimit.WithDenied(func(http.ResponseWriter, *http.Request, engine.Decision) {}))
			require.NoError(t, err)
			h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("X-User", c.user)
			r.Header.Set("Cost", "1")
			w := &nopWriter{h: http.Header{}}
			h.ServeHTTP(w, r) // create the key first
			r.Header.Set("Cost", c.cost)
			allocs := testing.AllocsPerRun(200, func() {
				clear(w.h)
				h.ServeHTTP(w, r)
			})
			want := 4.0 // admitted: the fields, and the request Settle reads
			if c.cost != "1" {
				want = 2.0 // denied: the fields alone
			}
			assert.Equal(t, want, allocs)
			assert.NotEmpty(t, w.h.Get("RateLimit-Policy"))
			assert.NotEmpty(t, w.h.Get("RateLimit"))
		})
	}
}
