package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// Rates of any period and bands as the harness builds and prints them.

// mustBands is policy.NewBands for bands the harness knows to be valid; it
// panics on an error. The differential check prints policies that carry
// bands with it, so a reproduction pastes into a test of this package.
func mustBands(bands ...policy.Band) *policy.BandSet {
	s, err := policy.NewBands(bands...)
	if err != nil {
		panic(fmt.Sprintf("stress: %v", err))
	}
	return s
}

// rateText renders a rate compactly: "7/3s".
func rateText(r policy.Rate) string {
	if r.Per == math.MaxInt64 {
		return fmt.Sprintf("%d/MaxInt64ns", r.Tokens)
	}
	return fmt.Sprintf("%d/%v", r.Tokens, r.Per)
}

// limitRateText renders a limit's rate as it was given: "rate 5" for
// TokensPerSecond 5 (as before rates of any period), "refill 7/3s" else.
func limitRateText(tokensPerSecond int64, refill policy.Rate) string {
	if refill.IsZero() {
		return fmt.Sprintf("rate %d", tokensPerSecond)
	}
	if tokensPerSecond != 0 {
		return fmt.Sprintf("rate %d refill %s", tokensPerSecond, rateText(refill)) // invalid, but printable
	}
	return "refill " + rateText(refill)
}

// bandsText renders a set compactly, in order: {"daily" 20 20/24h0m0s ...},
// or "" for none.
func bandsText(s *policy.BandSet) string {
	if s.Len() == 0 {
		return ""
	}
	parts := make([]string, 0, s.Len())
	for _, b := range s.Bands() {
		parts = append(parts, fmt.Sprintf("%q %d %s", b.Name, b.Capacity, rateText(b.Refill)))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// goDuration prints d as a Go expression of type time.Duration.
func goDuration(d time.Duration) string {
	switch {
	case d == math.MaxInt64:
		return "math.MaxInt64"
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%d * time.Hour", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%d * time.Minute", d/time.Minute)
	case d >= time.Second && d%time.Second == 0:
		return fmt.Sprintf("%d * time.Second", d/time.Second)
	case d >= time.Millisecond && d%time.Millisecond == 0:
		return fmt.Sprintf("%d * time.Millisecond", d/time.Millisecond)
	}
	return fmt.Sprint(int64(d))
}

// goRate prints r as the Go expression that builds it.
func goRate(r policy.Rate) string {
	return fmt.Sprintf("policy.Rate{Tokens: %s, Per: %s}", goInt(r.Tokens), goDuration(r.Per))
}

func goInt(n int64) string {
	if n == math.MaxInt64 {
		return "math.MaxInt64"
	}
	return fmt.Sprint(n)
}

// goLimitRate prints a limit's rate fields as Go, as they were given:
// "TokensPerSecond: 5" alone when Refill is not set (as before rates of any
// period), "Refill: ..." alone when TokensPerSecond is 0.
func goLimitRate(tokensPerSecond int64, refill policy.Rate) string {
	switch {
	case refill.IsZero():
		return fmt.Sprintf("TokensPerSecond: %d", tokensPerSecond)
	case tokensPerSecond == 0:
		return "Refill: " + goRate(refill)
	}
	return fmt.Sprintf("TokensPerSecond: %d, Refill: %s", tokensPerSecond, goRate(refill))
}

// goBands prints s as the Go expression that builds it, with mustBands.
func goBands(s *policy.BandSet) string {
	parts := make([]string, 0, s.Len())
	for _, b := range s.Bands() {
		parts = append(parts, fmt.Sprintf("policy.Band{Name: %q, Capacity: %s, Refill: %s}", b.Name, goInt(b.Capacity), goRate(b.Refill)))
	}
	return "mustBands(" + strings.Join(parts, ", ") + ")"
}

// shapeOf is the whole limit p gives key, by the model's resolver.
func shapeOf(p policy.Policy, key string) policy.Shape { return model.ShapeOf(p, key) }

// overridden reports whether p gives key a limit other than its own
// default: the decisions "under an override" the checks count.
func overridden(p policy.Policy, key string) bool { return model.ShapeOf(p, key) != p.Shape() }

// minCapacity is the largest cost sh admits: its smallest band capacity.
func minCapacity(sh policy.Shape) int64 {
	c := sh.Primary.Capacity
	for i := 1; i < sh.Len(); i++ {
		c = min(c, sh.Band(i).Capacity)
	}
	return c
}

// wide reports whether sh has several bands or a rate that is not per
// second: a decision the checks count as exercising bands and periods.
func wide(sh policy.Shape) (bands, period bool) {
	for i := range sh.Len() {
		if sh.Band(i).Rate().Per != time.Second {
			period = true
		}
	}
	return sh.Len() > 1, period
}

// recordShape counts a decision's shape into c: several bands, a band
// other than the primary binding, a rate not per second.
func recordShape(c *counters, sh policy.Shape, d string) {
	bands, period := wide(sh)
	if bands {
		c.multiBand.Add(1)
		if d != sh.Name {
			c.bandBound.Add(1)
		}
	}
	if period {
		c.otherPeriod.Add(1)
	}
}

// bandMoves returns how many changes a cutover from old to next makes to
// one key's bands, counting each kind into ev if it is not nil.
func bandMoves(old, next policy.Shape, ev map[string]int) int {
	n := 0
	count := func(e string) {
		if ev != nil {
			ev[e]++
		}
		n++
	}
	if old.Primary.Rate().Per != next.Primary.Rate().Per {
		count("cutover: the primary's period changes")
	}
	for i := 1; i < next.Len(); i++ {
		j := old.Bands.Index(next.BandName(i))
		if j < 0 {
			count("cutover: a band added")
			if next.BandName(i) == old.Name && old.Name != "" {
				count("cutover: a band added under the old primary's name")
			}
			continue
		}
		o, nb := old.Bands.Limit(j), next.Band(i)
		switch {
		case nb.Capacity > o.Capacity:
			count("cutover: a band's capacity goes up")
		case nb.Capacity < o.Capacity:
			count("cutover: a band's capacity goes down")
		}
		switch {
		case nb.Refill.Per != o.Refill.Per:
			count("cutover: a band's period changes")
		case nb.Refill.Tokens != o.Refill.Tokens:
			count("cutover: a band's rate changes within its period")
		}
		if j != i-1 {
			count("cutover: a band moves in the order")
		}
	}
	for i := range old.Bands.Len() {
		if next.Bands.Index(old.Bands.At(i).Name) < 0 {
			count("cutover: a band dropped")
		}
	}
	return n
}

// namedOverrides builds the set of os, first clearing each Name an earlier
// override has or one of its own bands has (overrides with different limits
// may not share a Name, and a band may not have its override's).
func namedOverrides(os []policy.Override) *policy.OverrideSet {
	names := map[string]bool{}
	for i := range os {
		if n := os[i].Name; n != "" && (names[n] || os[i].Bands.Index(n) >= 0) {
			os[i].Name = ""
		}
		names[os[i].Name] = true
	}
	return mustOverrides(os...)
}
