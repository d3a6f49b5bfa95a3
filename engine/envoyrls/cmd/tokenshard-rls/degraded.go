package main

import (
	"context"
	"fmt"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// errDegraded: the store answered a decision by its failure rule (Redis did
// not answer in time), not by Redis. It wraps redisstore.ErrUnavailable, so
// envoyrls sends it as gRPC Unavailable and Envoy's failure_mode_deny
// decides, never an OK or an OVER_LIMIT that Redis did not give.
var errDegraded = fmt.Errorf("tokenshard-rls: %w: a decision was answered by the store's failure rule", redisstore.ErrUnavailable)

// degradedAsError is the store, with every decision answered by its failure
// rule turned into errDegraded.
//
// The store says so only through its Failures counter (and OnError), not in
// the Decision. A call that the failure rule answered counts one failure per
// request before it returns, so a Failures count that moved during the call
// catches every such answer. It may also catch another call's failure that
// happened meanwhile, turning a decision Redis gave into an error: only
// while Redis fails, and then the error leaves the answer to Envoy's failure
// mode, which is what this wrapper is for. A degraded AllowAll took nothing
// (a fail-open admission takes nothing; a lost reply took all or nothing).
type degradedAsError struct{ *redisstore.Store }

var _ engine.Admitter = degradedAsError{}

func (s degradedAsError) watch() func() error {
	before := s.Stats().Failures
	return func() error {
		if s.Stats().Failures != before {
			return errDegraded
		}
		return nil
	}
}

func (s degradedAsError) Allow(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	check := s.watch()
	d, err := s.Store.Allow(ctx, key, cost)
	if err == nil {
		err = check()
	}
	if err != nil {
		return engine.Decision{}, err
	}
	return d, nil
}

func (s degradedAsError) AllowAll(ctx context.Context, reqs []engine.Request) (engine.Decision, int, error) {
	check := s.watch()
	d, i, err := s.Store.AllowAll(ctx, reqs)
	if err == nil {
		err = check()
	}
	if err != nil {
		return engine.Decision{}, max(i, -1), err
	}
	return d, i, nil
}

func (s degradedAsError) AllowBatch(ctx context.Context, reqs []engine.Request, out []engine.Result) error {
	check := s.watch()
	if err := s.Store.AllowBatch(ctx, reqs, out); err != nil {
		return err
	}
	if err := check(); err != nil {
		for i := range reqs {
			if out[i].Err == nil {
				out[i] = engine.Result{Err: err}
			}
		}
		return nil
	}
	return nil
}
