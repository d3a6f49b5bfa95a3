package redisstore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/tokenshard/tokenshard/policy"
)

// wirePolicy is a policy as Redis stores it, readable with redis-cli.
type wirePolicy struct {
	Version         int64
	Capacity        int64
	TokensPerSecond int64
	Overrides       []policy.Override `json:",omitempty"`
}

func encodePolicy(p policy.Policy) (string, error) {
	b, err := json.Marshal(wirePolicy{p.Version, p.Capacity, p.TokensPerSecond, p.Overrides.Overrides()})
	return string(b), err
}

func decodePolicy(blob string) (policy.Policy, error) {
	var w wirePolicy
	if err := json.Unmarshal([]byte(blob), &w); err != nil {
		return policy.Policy{}, err
	}
	set, err := policy.NewOverrideSet(w.Overrides...)
	if err != nil {
		return policy.Policy{}, err
	}
	p := policy.Policy{Version: w.Version, Capacity: w.Capacity, TokensPerSecond: w.TokensPerSecond, Overrides: set}
	if err := p.Validate(); err != nil {
		return policy.Policy{}, fmt.Errorf("decoding %q: %w", blob, err)
	}
	return p, nil
}

// durationOf converts the policy package's saturated nanoseconds.
func durationOf(ns int64) time.Duration { return time.Duration(ns) }
