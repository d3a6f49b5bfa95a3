package main

import (
	"fmt"
	"strings"

	"github.com/tokenshard/tokenshard/policy"
)

// Per-key overrides as the harness builds and prints them.

// mustOverrides is policy.NewOverrideSet for overrides the harness knows to
// be valid; it panics on an error. The differential check prints policies
// that carry overrides with it, so a reproduction pastes into a test of this
// package as Go.
func mustOverrides(overrides ...policy.Override) *policy.OverrideSet {
	s, err := policy.NewOverrideSet(overrides...)
	if err != nil {
		panic(fmt.Sprintf("stress: %v", err))
	}
	return s
}

// overridesText renders a set compactly, in declaration order, for
// comparisons, canonical states and violations: [match cap/rate ...], or ""
// for none; a Refill, a Name and Bands are shown when set.
func overridesText(s *policy.OverrideSet) string {
	if s.Len() == 0 {
		return ""
	}
	parts := make([]string, 0, s.Len())
	for _, o := range s.Overrides() {
		part := fmt.Sprintf("%q %d/%d", o.Match, o.Capacity, o.TokensPerSecond)
		if !o.Refill.IsZero() {
			part = fmt.Sprintf("%q %d %s", o.Match, o.Capacity, limitRateText(o.TokensPerSecond, o.Refill))
		}
		if o.Name != "" {
			part += fmt.Sprintf(" name %q", o.Name)
		}
		if b := bandsText(o.Bands); b != "" {
			part += " bands " + b
		}
		parts = append(parts, part)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// policyText renders p for violations: "v1 cap 10 rate 2" (or "refill
// 7/3s"), its bands and its overrides if it has any.
func policyText(p policy.Policy) string {
	s := fmt.Sprintf("v%d cap %d %s", p.Version, p.Capacity, limitRateText(p.TokensPerSecond, p.Refill))
	if b := bandsText(p.Bands); b != "" {
		s += " bands " + b
	}
	if o := overridesText(p.Overrides); o != "" {
		s += " overrides " + o
	}
	return s
}
