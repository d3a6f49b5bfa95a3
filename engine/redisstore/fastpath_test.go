package redisstore_test

import (
	"fmt"
	"math"
	"math/big"
	"testing"

	"github.com/tokenshard/tokenshard/policy"
)

// TestFastPathEdges drives the script's double fast path at its
// edges: capacities around FASTCAP, rates around 2^52/2^53, elapsed times
// around 9e6 s with ns parts on both sides, short (< 10 digit) instants,
// and refills landing at full-1, full, full+1.
func TestFastPathEdges(t *testing.T) {
	skipUnderRace(t)
	caps := []int64{1, 2, 3, 10, 4_503_598, 4_503_599, 4_503_600}
	rates := []int64{1, 2, 3, 999_999_999, 1e9, 1e9 + 1, 1<<52 - 1, 1 << 52, 1<<52 + 1, 1<<53 - 1, 1 << 53, 1<<53 + 1, math.MaxInt64}
	type tl struct{ last, now int64 }
	times := []tl{
		{0, 0}, {0, 1}, {1, 2}, {5, 999_999_999}, {999_999_999, 1_000_000_000}, {999_999_999, 1_000_000_001},
		{123, 1_000_000_122}, {1_000_000_001, 1_000_000_000}, // stepped back across a second
		{999_999_999, 9_000_000_999_999_998}, {999_999_999, 9_000_001_000_000_000}, {0, 9_000_000_000_000_000},
		{0, 9_000_000_999_999_999}, {1, 9_000_001_000_000_000}, {500_000_000, 9_000_000_499_999_999},
		{7_000_000_000_000_000_000, 7_000_000_000_000_000_001}, {7_000_000_000_000_000_000, 7_000_009_000_000_000_000},
		{7_000_000_000_999_999_999, 7_000_009_000_000_000_000},
	}
	var cases []arithCase
	for _, c := range caps {
		full := new(big.Int).Mul(big.NewInt(c), big.NewInt(policy.UnitsPerToken))
		for _, r := range rates {
			for _, tt := range times {
				for _, u := range []*big.Int{new(big.Int), big.NewInt(1), new(big.Int).Sub(full, big.NewInt(1)), full} {
					cases = append(cases, arithCase{capacity: c, rate: r, units: u, last: tt.last, now: tt.now, cost: 1})
				}
			}
			// refills landing exactly at full-1, full, full+1 with short instants
			for _, d := range []int64{1, 999_999_999, 1e9, 1e9 + 7, 4_503_598_999_999_999} {
				if new(big.Int).SetInt64(d).Cmp(full) > 0 {
					continue
				}
				u := new(big.Int).Sub(full, big.NewInt(d))
				el := (d + r - 1) / r // ns to full
				for _, e := range []int64{el - 1, el, el + 1} {
					if e < 0 {
						continue
					}
					for _, last := range []int64{0, 7, 999_999_999} {
						cases = append(cases, arithCase{capacity: c, rate: r, units: u, last: last, now: last + e, cost: c})
					}
				}
			}
		}
	}
	t.Logf("%d cases", len(cases))
	rig := newArithRig(t)
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) { rig.check(t, c) })
	}
}
