package enginemodel

import (
	"errors"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDefaults: the model's own default bounds are the engine's.
func TestDefaults(t *testing.T) {
	assert.Equal(t, engine.DefaultMaxKeys, model.DefaultMaxKeys)
	assert.Equal(t, engine.DefaultMaxKeyBytes, model.DefaultMaxKeyBytes)
	assert.Equal(t, engine.MaxAllowAll, model.MaxAllowAll)
}

// TestErrors: each model error becomes the very engine value of its name,
// ErrCostExceedsCapacity still matching ErrInvalidCost; anything else passes
// through unchanged.
func TestErrors(t *testing.T) {
	for _, p := range errPairs {
		assert.Equal(t, p.engine, engineErr(p.model), "%v", p.model)
	}
	assert.ErrorIs(t, engineErr(model.ErrCostExceedsCapacity), engine.ErrInvalidCost)
	assert.NoError(t, engineErr(nil))
	other := errors.New("other")
	assert.Equal(t, other, engineErr(other))

	m := New(policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}, 1, 3)
	_, err := m.Allow(0, "abcd", 1)
	assert.Equal(t, engine.ErrInvalidKey, err)
	_, err = m.Allow(0, "abc", 6)
	assert.Equal(t, engine.ErrCostExceedsCapacity, err)
	assert.ErrorIs(t, m.ReplacePolicy(0, policy.Policy{}, 1), policy.ErrInvalid)
	assert.Equal(t, engine.ErrStalePolicy, m.ReplacePolicy(0, policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}, 2))
	_, at, err := m.AllowAll(0, nil)
	assert.Equal(t, engine.ErrAllowAllSize, err)
	assert.Equal(t, -1, at)
	_, at, err = m.AllowAll(0, []engine.Request{{Key: "a", Cost: 1}, {Key: "a", Cost: 5}})
	assert.Equal(t, engine.ErrCostExceedsCapacity, err, "costs of one key add up")
	assert.Zero(t, at)
	_, err = m.Refund(0, "a", 0)
	assert.Equal(t, engine.ErrInvalidCost, err)
	_, err = m.Peek(0, "abcd")
	assert.Equal(t, engine.ErrInvalidKey, err)
}

// TestAnswers: Allow and AllowBatch carry the model's Decision field for
// field, and a batch answers as the same Allow calls in order do.
func TestAnswers(t *testing.T) {
	p := policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 2}
	single, batch := New(p, 0, 0), New(p, 0, 0)
	raw := model.New(p, 0, 0)
	reqs := []engine.Request{{Key: "k", Cost: 4}, {Key: "", Cost: 1}, {Key: "k", Cost: 7}, {Key: "j", Cost: 0}}
	got := batch.AllowBatch(0, reqs)
	require.Len(t, got, len(reqs))
	for i, r := range reqs {
		d, err := single.Allow(0, r.Key, r.Cost)
		assert.Equal(t, engine.Result{Decision: d, Err: err}, got[i], "request %d", i)
		md, merr := raw.Allow(0, r.Key, r.Cost)
		assert.Equal(t, decisionOf(md), d, "request %d", i)
		assert.Equal(t, merr == nil, err == nil, "request %d", i)
	}
	n, err := single.EvictFull(10e9)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	c := batch.Clone()
	_, err = c.EvictFull(10e9)
	require.NoError(t, err)
	assert.Equal(t, 1, batch.KeyCount(), "Clone is deep")
	assert.Zero(t, c.KeyCount())
}

// TestDecisionOf: every field of the model's Decision is a field of
// engine.Decision of the same name and type (a decision.Name is a string
// there), and decisionOf copies it (each is made non-zero in turn, and
// must arrive, alone).
func TestDecisionOf(t *testing.T) {
	mt, et := reflect.TypeFor[model.Decision](), reflect.TypeFor[engine.Decision]()
	nameType := reflect.TypeFor[decision.Name]()
	for i := range mt.NumField() {
		mf := mt.Field(i)
		ef, ok := et.FieldByName(mf.Name)
		if !ok || (ef.Type != mf.Type && (mf.Type != nameType || ef.Type.Kind() != reflect.String)) {
			t.Errorf("model.Decision.%s (%v) is not a field of engine.Decision of that type", mf.Name, mf.Type)
			continue
		}
		var md model.Decision
		v := reflect.ValueOf(&md).Elem().Field(i)
		arrives := v
		switch {
		case mf.Type == nameType:
			v.Set(reflect.ValueOf(decision.NameOf("band")))
			arrives = reflect.ValueOf("band")
		case v.Kind() == reflect.Bool:
			v.SetBool(true)
		case v.Kind() == reflect.Int64:
			v.SetInt(int64(i) + 7)
		default:
			t.Fatalf("model.Decision.%s: a field of kind %v: teach this test to set it", mf.Name, v.Kind())
		}
		var want engine.Decision
		reflect.ValueOf(&want).Elem().FieldByName(mf.Name).Set(arrives)
		assert.Equal(t, want, decisionOf(md), "model.Decision.%s", mf.Name)
	}
}
