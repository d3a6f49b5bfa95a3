package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// quotaHeaders sends one request keyed by X-User and returns its two fields.
func quotaHeaders(t *testing.T, h http.Handler, user string) (string, string) {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, "/", nil)
	require.NoError(t, err)
	r.RemoteAddr = "192.0.2.1:1"
	r.Header.Set("X-User", user)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	require.Equal(t, http.StatusOK, rec.Code, "user %q", user)
	return rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit")
}

// Each quota answers under its own name: the default under the policy
// name, a named override under its Name, an unnamed one under a name
// derived from its quota; and no Name can pass one quota off as another.
func TestQuotaNames(t *testing.T) {
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "gold:*", Capacity: 50, TokensPerSecond: 5, Name: "gold"},
		policy.Override{Match: "platinum", Capacity: 50, TokensPerSecond: 5, Name: "platinum"}, // gold's limit, its own name
		policy.Override{Match: "silver", Capacity: 20, TokensPerSecond: 2},
		policy.Override{Match: "bronze*", Capacity: 20, TokensPerSecond: 2},                          // silver's limit: one derived name
		policy.Override{Match: "plain", Capacity: 100, TokensPerSecond: 1},                           // the default's limit
		policy.Override{Match: "impostor", Capacity: 7, TokensPerSecond: 1, Name: "api"},             // the policy name, another quota
		policy.Override{Match: "fake-derived", Capacity: 8, TokensPerSecond: 1, Name: "api-20-2"},    // silver's derived name
		policy.Override{Match: "fake-suffixed", Capacity: 8, TokensPerSecond: 2, Name: "api-20-2-1"}, // silver's, were a band named api-20-2
		policy.Override{Match: "own-derived", Capacity: 9, TokensPerSecond: 3, Name: "api-9-3"},      // its own: kept
		policy.Override{Match: "own-suffixed", Capacity: 9, TokensPerSecond: 5, Name: "api-9-5-2"},   // its own: kept
		policy.Override{Match: "not-derived", Capacity: 9, TokensPerSecond: 4, Name: "api-09-4"},     // not canonical: a plain name
		policy.Override{Match: "quoted", Capacity: 3, TokensPerSecond: 1, Name: `say "hi" \ bye`},
	)
	require.NoError(t, err)
	p := pol(100, 1)
	p.Overrides = set
	e, _ := newEngine(t, engine.Config{Policy: p})
	h := limited(t, e, httplimit.WithKey(userKey), httplimit.WithPolicyName("api"))

	for _, c := range []struct {
		user, policy, limit string
	}{
		{"nobody", `"api";q=100;w=100`, `"api";r=99;t=1`},
		{"gold:acme", `"gold";q=50;w=10`, `"gold";r=49;t=1`},
		{"platinum", `"platinum";q=50;w=10`, `"platinum";r=49;t=1`},
		{"silver", `"api-20-2";q=20;w=10`, `"api-20-2";r=19;t=1`},
		{"bronze:x", `"api-20-2";q=20;w=10`, `"api-20-2";r=19;t=1`},
		{"plain", `"api";q=100;w=100`, `"api";r=99;t=1`},
		{"impostor", `"api-7-1";q=7;w=7`, `"api-7-1";r=6;t=1`},
		{"fake-derived", `"api-8-1";q=8;w=8`, `"api-8-1";r=7;t=1`},
		{"fake-suffixed", `"api-8-2";q=8;w=4`, `"api-8-2";r=7;t=1`},
		{"own-derived", `"api-9-3";q=9;w=3`, `"api-9-3";r=8;t=1`},
		{"own-suffixed", `"api-9-5-2";q=9;w=2`, `"api-9-5-2";r=8;t=1`},
		{"not-derived", `"api-09-4";q=9;w=3`, `"api-09-4";r=8;t=1`},
		{"quoted", `"say \"hi\" \\ bye";q=3;w=3`, `"say \"hi\" \\ bye";r=2;t=1`},
	} {
		gotPolicy, gotLimit := quotaHeaders(t, h, c.user)
		assert.Equal(t, c.policy, gotPolicy, "user %q", c.user)
		assert.Equal(t, c.limit, gotLimit, "user %q", c.user)
	}

	// The policy name on an override with the default's quota is no
	// impostor: it is kept.
	set, err = policy.NewOverrideSet(policy.Override{Match: "plain-named", Capacity: 100, TokensPerSecond: 1, Name: "api"})
	require.NoError(t, err)
	p.Overrides = set
	e, _ = newEngine(t, engine.Config{Policy: p})
	h = limited(t, e, httplimit.WithKey(userKey), httplimit.WithPolicyName("api"))
	gotPolicy, _ := quotaHeaders(t, h, "plain-named")
	assert.Equal(t, `"api";q=100;w=100`, gotPolicy)
}

// The name follows the policy in force: after a cutover renames an
// override, its keys answer under the new name.
func TestQuotaNameFollowsCutover(t *testing.T) {
	next := func(version int64, name string) policy.Policy {
		set, err := policy.NewOverrideSet(policy.Override{Match: "alice", Capacity: 5, TokensPerSecond: 1, Name: name})
		require.NoError(t, err)
		p := pol(10, 1)
		p.Version, p.Overrides = version, set
		return p
	}
	e, _ := newEngine(t, engine.Config{Policy: next(1, "trial")})
	h := limited(t, e, httplimit.WithKey(userKey))

	got, _ := quotaHeaders(t, h, "alice")
	assert.Equal(t, `"trial";q=5;w=5`, got)
	require.NoError(t, e.ReplacePolicy(context.Background(), next(2, ""), 1))
	got, _ = quotaHeaders(t, h, "alice")
	assert.Equal(t, `"default-5-1";q=5;w=5`, got)
	got, _ = quotaHeaders(t, h, "bob")
	assert.Equal(t, `"default";q=10;w=10`, got)
}
