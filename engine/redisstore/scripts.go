package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

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

// loadDecide loads the decide script on every master: the FUNCTION library
// (unless FUNCTION was refused: the store then sends EVALSHA from then on),
// and the script for EVALSHA, which the store also sends where a FUNCTION
// cannot run (see classify). On a cluster a master that cannot be reached
// (see nodeLost) is passed over, and OnError told: a call on its shards
// fails anyway, and once it is back the first call there meets the script
// missing and loads it; failing here would leave every other master's
// calls to the failure rule while one master is away.
func (s *Store) loadDecide(ctx context.Context) error {
	ms, err := s.masters(ctx)
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
