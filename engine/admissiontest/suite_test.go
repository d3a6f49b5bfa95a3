package admissiontest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/admissiontest"
	"github.com/tokenshard/tokenshard/policy"
)

// The suite's own tests check that it has teeth: subjects with one planted
// fault each must fail the subtests meant to catch that fault, and the same
// wrapper without a fault must pass. Each runs in a child process (this test
// binary again), since a failing suite fails the *testing.T it is given.

// TestMain fails the package if a test leaves a goroutine behind: the child
// processes run the whole suite, engines and concurrent callers included.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mutantEnv names the fault the child process plants.
const mutantEnv = "ADMISSIONTEST_MUTANT"

// mutants maps each planted fault to subtests that must catch it.
var mutants = map[string][]string{
	"none": nil,
	// A store that starts afresh at every cutover hands everyone a full
	// bucket: the classic free-token bug.
	"forgets-on-cutover": {
		"WorkedExamples/CutoverOneTokenAtTheCutover", "Cutover/RaisingCapacityTopsNobodyUp",
		"Overrides/Cutover", "CutoverChain/Random", "Differential/Random",
		"Bands/CutoverRaisingBandTopsNobodyUp", "Bands/CutoverPeriodChangeRoundsDown", "Bands/Random",
	},
	"ignores-context":           {"Errors/DoneContext", "Errors/Order"},
	"batch-returns-first-error": {"Batch/PerRequestErrors", "Differential/Random"},
	"close-twice-fails":         {"Errors/Closed"},
	"policy-never-changes": {"Cutover/NewPolicyEverywhere", "Cutover/InvalidNext", "CutoverChain/Random", "Differential/Random",
		"Bands/CutoverRaisingBandTopsNobodyUp", "Bands/Random"},
	"evict-nothing": {"WorkedExamples/EvictFull", "Overrides/EvictAndReturn", "Differential/Random", "Bands/EvictFullNeedsEveryBandFull"},
	// An AllowAll that takes from the keys before the one that denies, as
	// Allow calls one after another would: not all or nothing.
	"allowall-takes-before-denial": {"AllowAll/OneShortTakesNothing", "AllowAll/RepeatedKeysAddUp", "AllowAll/ConcurrentAllOrNothing", "AllowAll/Random"},
	// An AllowAll that checks every cost before every key.
	"allowall-costs-before-keys": {"AllowAll/ErrorOrder"},
}

// failLine matches a failed subtest of the child's verbose output.
var failLine = regexp.MustCompile(`--- FAIL: TestMutantChild/(\S+)`)

func TestSuiteCatchesMutants(t *testing.T) {
	names := make([]string, 0, len(mutants))
	for name := range mutants {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMutantChild$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+name)
			out, err := cmd.CombinedOutput()
			failed := map[string]bool{}
			for _, m := range failLine.FindAllStringSubmatch(string(out), -1) {
				failed[m[1]] = true
			}
			if name == "none" {
				require.NoError(t, err, "the suite fails the engine behind a wrapper with no fault:\n%s", out)
				return
			}
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "the suite passed a subject with the fault %q", name)
			for _, want := range mutants[name] {
				require.True(t, failed[want], "the fault %q went unnoticed by %s; failed subtests: %v", name, want, keys(failed))
			}
		})
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestMutantChild is the child process's test: it runs the suite over a
// one-shard engine with the fault named by mutantEnv planted in front of it.
// It is skipped in a normal run.
func TestMutantChild(t *testing.T) {
	fault := os.Getenv(mutantEnv)
	if fault == "" {
		t.Skip("run only as a child of TestSuiteCatchesMutants")
	}
	admissiontest.Run(t, func(t *testing.T, s admissiontest.Setup) engine.Admitter {
		m := &mutant{fault: fault, clk: s.Clock, initial: s.Policy}
		m.cur.Store(m.start(t, s.Policy))
		t.Cleanup(func() { m.cur.Load().Close() })
		return m
	})
}

// mutant is an engine with one planted fault. It is safe for concurrent use
// as far as the suite needs: only ReplacePolicy swaps the engine, under mu.
type mutant struct {
	fault   string
	clk     *clock.Manual
	initial policy.Policy
	cur     atomic.Pointer[engine.Engine]
	mu      sync.Mutex
	closes  atomic.Int32
}

func (m *mutant) start(t *testing.T, p policy.Policy) *engine.Engine {
	e, err := engine.New(engine.Config{Policy: p, Clock: m.clk, Shards: 1})
	require.NoError(t, err)
	return e
}

// ctx drops the caller's context under the fault ignores-context.
func (m *mutant) ctx(ctx context.Context) context.Context {
	if m.fault == "ignores-context" {
		return context.Background()
	}
	return ctx
}

func (m *mutant) Allow(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	return m.cur.Load().Allow(m.ctx(ctx), key, cost)
}

func (m *mutant) AllowBatch(ctx context.Context, reqs []engine.Request, out []engine.Result) error {
	err := m.cur.Load().AllowBatch(m.ctx(ctx), reqs, out)
	if err == nil && m.fault == "batch-returns-first-error" {
		for i := range reqs {
			if out[i].Err != nil {
				return out[i].Err
			}
		}
	}
	return err
}

func (m *mutant) AllowAll(ctx context.Context, reqs []engine.Request) (engine.Decision, int, error) {
	e := m.cur.Load()
	if m.fault == "allowall-costs-before-keys" && len(reqs) <= engine.MaxAllowAll {
		for i, r := range reqs {
			if r.Cost < 1 {
				return engine.Decision{}, i, engine.ErrInvalidCost
			}
		}
	}
	d, at, err := e.AllowAll(m.ctx(ctx), reqs)
	if err == nil && !d.Allowed && m.fault == "allowall-takes-before-denial" {
		for _, r := range reqs[:at] {
			_, _ = e.Allow(ctx, r.Key, r.Cost) // what the requests before the binding one would have taken
		}
	}
	return d, at, err
}

func (m *mutant) Charge(ctx context.Context, key string, tokens int64) (engine.Decision, error) {
	return m.cur.Load().Charge(m.ctx(ctx), key, tokens)
}

func (m *mutant) Refund(ctx context.Context, key string, tokens int64) (engine.Decision, error) {
	return m.cur.Load().Refund(m.ctx(ctx), key, tokens)
}

func (m *mutant) EvictFull(ctx context.Context) (int, error) {
	if m.fault == "evict-nothing" {
		return 0, m.ctx(ctx).Err()
	}
	return m.cur.Load().EvictFull(m.ctx(ctx))
}

func (m *mutant) ReplacePolicy(ctx context.Context, next policy.Policy, expectedVersion int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.cur.Load()
	if err := old.ReplacePolicy(m.ctx(ctx), next, expectedVersion); err != nil || m.fault != "forgets-on-cutover" {
		return err
	}
	fresh, err := engine.New(engine.Config{Policy: next, Clock: m.clk, Shards: 1})
	if err != nil {
		return err
	}
	m.cur.Store(fresh)
	return old.Close()
}

func (m *mutant) Policy() policy.Policy {
	if m.fault == "policy-never-changes" {
		return m.initial
	}
	return m.cur.Load().Policy()
}

func (m *mutant) Close() error {
	err := m.cur.Load().Close()
	if m.closes.Add(1) > 1 && m.fault == "close-twice-fails" {
		return errors.Join(err, engine.ErrClosed)
	}
	return err
}
