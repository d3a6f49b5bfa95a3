package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// decideLib refills, decides and writes a chunk of buckets atomically; its
// header comment is the protocol. It defines the Lua function call(KEYS,
// ARGV), sent as a FUNCTION library (decideFuncSrc) where the server has
// FUNCTION, else as a script (decideSrc).
//
//go:embed decide.lua
var decideLib string

// decideSrc is decideLib as an EVALSHA script.
var decideSrc = decideLib + "\nreturn call(KEYS, ARGV)\n"

// decideFunc is the FUNCTION that runs decideLib: its library and function
// are named after the script's hash, so stores of different versions on
// one server each load and call their own.
var (
	decideFunc    = "tokenshard_decide_" + decideScript.Hash()[:16]
	decideFuncSrc = "#!lua name=tokenshard_" + decideScript.Hash()[:16] + "\n" + decideLib +
		"\nredis.register_function('" + decideFunc + "', call)\n"
)

// loadDecide loads the decide script where calls met it missing: on one
// server, on it; on a cluster, on each master that holds the slot of a key
// of at (a key of each such call), as the slot map says, or on every master
// if the slot map cannot tell or at is nil (a call met the script missing
// again after a load: its node, reached by following a MOVED, may not be
// the one the slot map names yet). It loads the FUNCTION library (unless
// FUNCTION was refused: the store then sends EVALSHA from then on), and the
// script for EVALSHA, which the store also sends where a FUNCTION cannot
// run (see classify). Only where it is missing: a master that hangs would
// hold the load, and so the call, until its deadline, and every master's
// first call meets the script missing anyway. On a cluster a master that
// cannot be reached (see nodeLost) is passed over, and OnError told: a call
// on its shards fails anyway, and once it is back the first call there
// meets the script missing and loads it.
func (s *Store) loadDecide(ctx context.Context, at []string) error {
	ms, err := s.loadTargets(ctx, at)
	for i := 0; err == nil && i < len(ms); i++ {
		err = s.loadOn(ctx, ms[i])
		if err != nil && s.cluster != nil && nodeLost(err) && ctx.Err() == nil {
			s.report(fmt.Errorf("%w: loading the script on a master that is away: %w", ErrUnavailable, err))
			err = nil
		}
	}
	if err != nil && ctx.Err() == nil && !errors.Is(err, ErrUnavailable) {
		return fmt.Errorf("%w: loading the script: %w", ErrUnavailable, err)
	}
	return err
}

// loadTargets is where loadDecide loads: the masters of at's keys, each
// once, or every master if at is nil or the slot map cannot tell.
func (s *Store) loadTargets(ctx context.Context, at []string) ([]redis.UniversalClient, error) {
	if s.cluster == nil || at == nil {
		return s.masters(ctx)
	}
	var ms []redis.UniversalClient
	for _, k := range at {
		m, err := s.cluster.MasterForKey(ctx, k)
		if err != nil {
			return s.masters(ctx)
		}
		if !slices.Contains(ms, redis.UniversalClient(m)) {
			ms = append(ms, m)
		}
	}
	return ms, nil
}

// loadOn loads the decide script on one master m (see loadDecide).
func (s *Store) loadOn(ctx context.Context, m redis.UniversalClient) error {
	if !s.noFunc.Load() {
		switch err := m.Do(ctx, "FUNCTION", "LOAD", "REPLACE", decideFuncSrc).Err(); {
		case err != nil && classify(err) == actNoFunc:
			s.noFunc.Store(true)
		case err != nil:
			return err
		}
	}
	return decideScript.Load(ctx, m).Err()
}

// callHead is how many words name a script call: FCALL name nkeys, or
// EVALSHA sha nkeys.
const callHead = 3

var decideScript = redis.NewScript(decideSrc)
