package admissiontest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// AllowBatch against its definition: every result is what the same Allow
// calls made one by one, in order, at the same instant would give.

var batchBehaviours = []behaviour{
	{"ShortOut", testBatchShortOut},
	{"Empty", testBatchEmpty},
	{"PerRequestErrors", testBatchPerRequestErrors},
	{"EqualsOneByOne", testBatchEqualsOneByOne},
}

// testBatchShortOut: len(out) < len(reqs) is ErrInvalidConfig, and nothing
// is decided: out is not written and no bucket is touched.
func testBatchShortOut(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	a, _ := newSubject(t, f, p)
	mustAllow(t, a, "a", 3, "setup")
	reqs := []engine.Request{{Key: "a", Cost: 3}, {Key: "b", Cost: 3}, {Key: "c", Cost: 3}}
	for n := range len(reqs) {
		var out []engine.Result
		if n > 0 {
			out = garbageOut(n)
		}
		err := a.AllowBatch(t.Context(), reqs, out)
		require.ErrorIs(t, err, engine.ErrInvalidConfig, "AllowBatch of %d requests into %d results", len(reqs), n)
		for i := range out {
			require.Equal(t, garbage, out[i], "AllowBatch of %d requests into %d results wrote out[%d]", len(reqs), n, i)
		}
	}
	expectAllow(t, a, "a", 3, allowed(4, p, 10, 3*time.Second), "after the refused batches, \"a\" spent only its setup")
	expectAllow(t, a, "b", 3, allowed(7, p, 10, 1500*time.Millisecond), "after the refused batches, \"b\" is new")
	expectAllow(t, a, "c", 3, allowed(7, p, 10, 1500*time.Millisecond), "after the refused batches, \"c\" is new")
}

// testBatchEmpty: an empty batch decides nothing and writes nothing.
func testBatchEmpty(t *testing.T, f Factory) {
	a, _ := newSubject(t, f, pol(1, 10, 2))
	require.NoError(t, a.AllowBatch(t.Context(), nil, nil), "AllowBatch(nil, nil)")
	out := garbageOut(2)
	require.NoError(t, a.AllowBatch(t.Context(), []engine.Request{}, out), "AllowBatch of no requests into 2 results")
	require.Equal(t, garbageOut(2), out, "AllowBatch of no requests wrote into out")
}

// testBatchPerRequestErrors: a batch with repeated keys and bad requests
// returns nil; each bad request gets its error in its own result, and the
// good ones are decided in order around them.
func testBatchPerRequestErrors(t *testing.T, f Factory) {
	p := pol(1, 5, 1)
	a, _ := newSubject(t, f, p)
	reqs := []engine.Request{
		{Key: "a", Cost: 2},
		{Key: " ", Cost: 1},
		{Key: "a", Cost: 0},
		{Key: "a", Cost: 6}, // above capacity: refused without spending
		{Key: "b", Cost: 5},
		{Key: "a", Cost: 3},
		{Key: "a", Cost: 1},
		{Key: keyOverMaxBytes, Cost: 1},
		{Key: "b", Cost: -3},
		{Key: "b", Cost: 1},
	}
	want := []struct {
		d   engine.Decision
		err error
	}{
		{d: allowed(3, p, 5, 2*time.Second)},
		{err: engine.ErrInvalidKey},
		{err: engine.ErrInvalidCost},
		{err: engine.ErrCostExceedsCapacity},
		{d: allowed(0, p, 5, 5*time.Second)},
		{d: allowed(0, p, 5, 5*time.Second)},
		{d: denied(0, time.Second, p, 5, 5*time.Second)},
		{err: engine.ErrInvalidKey},
		{err: engine.ErrInvalidCost},
		{d: denied(0, time.Second, p, 5, 5*time.Second)},
	}
	out := garbageOut(len(reqs) + 2)
	require.NoError(t, a.AllowBatch(t.Context(), reqs, out), "AllowBatch with bad requests: per-request errors belong in out[i].Err")
	for i, w := range want {
		if w.err != nil {
			require.ErrorIs(t, out[i].Err, w.err, "out[%d] for %+v", i, reqs[i])
			require.Zero(t, out[i].Decision, "out[%d] for %+v carries an error and a non-zero Decision", i, reqs[i])
			continue
		}
		require.NoError(t, out[i].Err, "out[%d] for %+v", i, reqs[i])
		require.Equal(t, w.d, out[i].Decision, "out[%d] for %+v decided wrongly", i, reqs[i])
	}
	require.Equal(t, garbageOut(2), out[len(reqs):], "AllowBatch wrote into out beyond len(reqs)")
}

// batchKeys are the valid keys of the random batches, one of exactly the
// default bound and one with inner spaces among them.
var batchKeys = []string{"a", "b", "c", "d", "e", "f", keyOfMaxBytes, " padded "}

// randomBatch returns up to 16 requests mixing repeated keys, invalid keys,
// and good, bad and over-capacity costs.
func randomBatch(r *rand.Rand, capacity int64) []engine.Request {
	reqs := make([]engine.Request, r.IntN(17))
	for i := range reqs {
		key := batchKeys[r.IntN(len(batchKeys))]
		if r.IntN(8) == 0 {
			key = invalidKeys[r.IntN(len(invalidKeys))]
		}
		var cost int64
		switch p := r.IntN(20); {
		case p < 13:
			cost = 1 + r.Int64N(3)
		case p < 15:
			cost = capacity
		case p < 17:
			cost = capacity + 1 + r.Int64N(3)
		default:
			cost = []int64{0, -1, math.MinInt64, math.MaxInt64}[r.IntN(4)]
		}
		reqs[i] = engine.Request{Key: key, Cost: cost}
	}
	return reqs
}

// testBatchEqualsOneByOne plays random batches on one subject and the same
// requests one by one through Allow on a twin, at the same instants, with
// cutovers and sweeps between rounds: every result agrees, and so does
// every key at the end (the state after).
func testBatchEqualsOneByOne(t *testing.T, f Factory) {
	const rounds = 15
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0xba7c4))
			start := pol(1, 5, 2)
			batched, bclk := newSubject(t, f, start)
			single, sclk := newSubject(t, f, start)
			for round := range rounds {
				where := fmt.Sprintf("seed %d, round %d, at %d ns", seed, round, bclk.Now())
				reqs := randomBatch(r, batched.Policy().Capacity)
				extra := r.IntN(3)
				out := garbageOut(len(reqs) + extra)
				require.NoError(t, batched.AllowBatch(t.Context(), reqs, out), "%s: AllowBatch(%+v)", where, reqs)
				for i, q := range reqs {
					d, err := single.Allow(t.Context(), q.Key, q.Cost)
					if err != nil {
						require.ErrorIs(t, out[i].Err, err, "%s: request %d %+v: the batch's error differs from Allow's", where, i, q)
					} else {
						require.NoError(t, out[i].Err, "%s: request %d %+v: the batch failed where Allow did not", where, i, q)
					}
					require.Equal(t, d, out[i].Decision, "%s: request %d %+v: the batch's Decision differs from Allow's", where, i, q)
				}
				require.Equal(t, garbageOut(extra), out[len(reqs):], "%s: AllowBatch wrote beyond len(reqs)", where)

				// Move both subjects the same way between rounds.
				step := time.Duration(r.Int64N(int64(1500 * time.Millisecond)))
				bclk.Advance(step)
				sclk.Advance(step)
				if r.IntN(5) == 0 {
					nb, errB := batched.EvictFull(t.Context())
					ns, errS := single.EvictFull(t.Context())
					require.NoError(t, errB, where)
					require.NoError(t, errS, where)
					require.Equal(t, ns, nb, "%s: EvictFull after batches and after single calls", where)
				}
				if r.IntN(5) == 0 {
					cur := batched.Policy()
					next := pol(cur.Version+1, 1+r.Int64N(8), 1+r.Int64N(4))
					require.NoError(t, batched.ReplacePolicy(t.Context(), next, cur.Version), where)
					require.NoError(t, single.ReplacePolicy(t.Context(), next, cur.Version), where)
				}
			}
			for _, key := range batchKeys {
				b := mustAllow(t, batched, key, 1, "the final probe of the batched subject")
				s := mustAllow(t, single, key, 1, "the final probe of the one-by-one subject")
				require.Equal(t, s, b, "seed %d: key %q differs at the end", seed, key)
			}
		})
	}
}
