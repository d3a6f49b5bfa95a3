package httplimit_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// namePieces build override, band and policy names that collide with one
// another and with derived names ("default-7-2", "default-10-100/1m",
// "default-7-2-1"), and names that need escaping.
var namePieces = []string{"default", "-", "1", "2", "7", "10", "100", "/", "1m", "60s", "1500ms", "s", "x", `"`, `\`, " ", "0"}

// fuzzRates are rates that are one rate written two ways (PerSecond(2),
// and 2 tokens per second given as TokensPerSecond) and periods whose
// derived names have each unit.
var fuzzRates = []policy.Rate{
	policy.PerSecond(1), policy.PerSecond(2), policy.PerMinute(100), policy.Rate{Tokens: 20, Per: 24 * time.Hour},
	{Tokens: 3, Per: 1500 * time.Millisecond}, {Tokens: 2, Per: 2 * time.Second}, {Tokens: 1, Per: time.Minute},
	{Tokens: 7, Per: 7}, {Tokens: 100, Per: time.Microsecond}, {Tokens: math.MaxInt64, Per: math.MaxInt64},
}

var fuzzCapacities = []int64{1, 2, 7, 10, math.MaxInt64}

type pieceBytes []byte

func (b *pieceBytes) next() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

func (b *pieceBytes) name() string {
	var s strings.Builder
	for range b.next() % 5 {
		s.WriteString(namePieces[int(b.next())%len(namePieces)])
	}
	return s.String()
}

// limit reads a capacity and a rate, as TokensPerSecond or as Refill.
func (b *pieceBytes) limit() (capacity, perSecond int64, refill policy.Rate) {
	capacity = fuzzCapacities[int(b.next())%len(fuzzCapacities)]
	c := b.next()
	r := fuzzRates[int(c>>1)%len(fuzzRates)]
	if c&1 != 0 && r.Per == time.Second {
		return capacity, r.Tokens, policy.Rate{}
	}
	return capacity, 0, r
}

func (b *pieceBytes) bands() *policy.BandSet {
	var bs []policy.Band
	for range b.next() % 4 {
		capacity, _, r := b.limit()
		bs = append(bs, policy.Band{Name: b.name(), Capacity: capacity, Refill: r})
	}
	s, err := policy.NewBands(bs...)
	if err != nil {
		return nil
	}
	return s
}

type quotaID struct {
	capacity int64
	rate     policy.Rate
}

// FuzzFields builds a policy from the fuzzer's bytes, with names chosen
// to collide, and checks the fields Fields.Append writes for a decision on
// each override's key and on a key with none: both parse as RFC 9651
// Lists; RateLimit-Policy lists the key's primary band then its bands, in
// order, with their capacities and windows, under distinct names, each band
// under its own Name; RateLimit is one item of those names, with r and t
// as the decision says; and across every key of the policy one primary
// name never stands for two different quotas.
func FuzzFields(f *testing.F) {
	f.Add([]byte{}, []byte{0, 0, 0, 0})
	f.Add([]byte{1, 0, 2}, []byte{1, 2, 3, 3, 1, 2, 1, 0, 2, 4, 5, 2, 1, 3, 2, 0, 3, 2, 1})
	f.Add([]byte{2, 0, 1, 2}, []byte{2, 2, 3, 1, 1, 0, 0, 2, 2, 1, 2, 1, 3, 1, 0, 4, 1, 1, 0, 2, 2, 4, 2, 2, 1, 2, 3, 0, 0})
	f.Fuzz(func(t *testing.T, names, shape []byte) {
		nb, b := pieceBytes(names), pieceBytes(shape)
		policyName := nb.name()
		fields, err := httplimit.NewFields(policyName)
		if err != nil {
			return // not printable ASCII
		}
		if policyName == "" {
			policyName = httplimit.DefaultPolicyName
		}
		p := policy.Policy{Version: 1}
		p.Capacity, p.TokensPerSecond, p.Refill = b.limit()
		p.Bands = b.bands()
		var ovs []policy.Override
		for i := range b.next() % 6 {
			o := policy.Override{Match: "key" + string(rune('a'+i)), Name: nb.name()}
			o.Capacity, o.TokensPerSecond, o.Refill = b.limit()
			o.Bands = b.bands()
			ovs = append(ovs, o)
		}
		if p.Overrides, err = policy.NewOverrideSet(ovs...); err != nil {
			return // a Name given to two limits, or to a band of its own
		}
		require.NoError(t, p.Validate())

		primaries := map[string]quotaID{} // primary name -> quota
		for i := 0; i <= len(ovs); i++ {
			key, capacity, rate, bands := "other", p.Capacity, p.Rate(), p.Bands
			if i < len(ovs) {
				o := ovs[i]
				key, capacity, bands = o.Match, o.Capacity, o.Bands
				rate = policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond, Refill: o.Refill}.Rate()
			}
			d := engine.Decision{Allowed: b.next()&1 == 0, Remaining: int64(b.next()) - 128,
				ResetAfter: time.Duration(b.next()) * 300 * time.Millisecond, RetryAfter: time.Duration(b.next()) * 700 * time.Millisecond}
			band := b.next() % 8
			if int(band) < bands.Len() {
				d.Band = bands.At(int(band)).Name
			}
			buf, end := fields.Append(nil, p, key, d)
			pol, err := parseSFList([]string{string(buf[:end])})
			require.NoError(t, err, "RateLimit-Policy %q", buf[:end])
			lim, err := parseSFList([]string{string(buf[end:])})
			require.NoError(t, err, "RateLimit %q", buf[end:])

			require.Len(t, pol, 1+bands.Len(), "RateLimit-Policy %q: the primary and each band", buf[:end])
			seen := map[string]bool{}
			for j, m := range pol {
				name, ok := m.value.(string)
				require.True(t, ok, "item %d of %q is a String", j, buf[:end])
				require.False(t, seen[name], "RateLimit-Policy %q names two bands %q", buf[:end], name)
				seen[name] = true
				c, r := capacity, rate
				if j > 0 {
					bd := bands.At(j - 1)
					require.Equal(t, bd.Name, name, "band %d of %q", j-1, buf[:end])
					c, r = bd.Capacity, bd.Refill
				}
				q, _ := m.param("q")
				w, _ := m.param("w")
				require.Equal(t, min(c, 999_999_999_999_999), q, "q of %q in %q", name, buf[:end])
				require.Equal(t, min(r.WindowSeconds(c), 999_999_999_999_999), w, "w of %q in %q", name, buf[:end])
			}
			primary := pol[0].value.(string)
			if prev, ok := primaries[primary]; ok && prev != (quotaID{capacity, rate}) {
				t.Fatalf("primary name %q stands for %+v and for %+v (key %q, policy name %q)", primary, prev, quotaID{capacity, rate}, key, policyName)
			}
			primaries[primary] = quotaID{capacity, rate}

			require.Len(t, lim, 1, "RateLimit %q", buf[end:])
			name, _ := lim[0].value.(string)
			wantName := primary
			if d.Band != "" {
				wantName = d.Band
			}
			require.Equal(t, wantName, name, "RateLimit %q for band %q", buf[end:], d.Band)
			r, _ := lim[0].param("r")
			require.Equal(t, max(d.Remaining, 0), r, "r of %q", buf[end:])
			tt, _ := lim[0].param("t")
			wantT := int64((d.ResetAfter + time.Second - 1) / time.Second)
			if !d.Allowed {
				wantT = max(int64((d.RetryAfter+time.Second-1)/time.Second), 1)
			}
			require.Equal(t, wantT, tt, "t of %q", buf[end:])
		}
	})
}
