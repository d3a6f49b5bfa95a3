// Package admissiontest is the behaviour suite that every engine.Admitter
// passes: the in-process Engine, and any store that shares quotas across
// processes (package engine/redisstore). One suite for every implementation
// keeps them answering alike, to the unit, so code written against Admitter
// can move from one to the other without noticing.
//
// A backend's test supplies a Factory that builds a fresh, empty subject
// reading its time from the given clock.Manual, and calls Run:
//
//	func TestAdmission(t *testing.T) {
//		admissiontest.Run(t, func(t *testing.T, s admissiontest.Setup) engine.Admitter {
//			e, err := engine.New(engine.Config{Policy: s.Policy, Clock: s.Clock})
//			if err != nil {
//				t.Fatalf("engine.New: %v", err)
//			}
//			t.Cleanup(func() { _ = e.Close() })
//			return e
//		})
//	}
//
// What the suite assumes of a subject, beyond the Admitter contract (the
// sections of package engine's doc):
//   - it reads time only from Setup.Clock, which starts at 0 and only moves
//     forward (the suite never steps a clock back, so ErrClockRegression is
//     not exercised here);
//   - its key length bound is the default, 256 bytes, and its key bound is at
//     least a few hundred keys (ErrKeyCapacity is not exercised here);
//   - each subtest gets its own subjects, which never see another subtest's
//     keys; subtests may run in any order and any subset (go test -run);
//   - the suite may Close a subject itself, so the Factory's cleanup must
//     tolerate a second Close (which the contract says returns nil).
//
// Random and long tests compare every answer with the math/big sequential
// model of package internal/model, and print a replayable op log on failure.
//
// The suite uses a subject from one goroutine at a time, except in subtests
// whose name starts with Concurrent. Every goroutine it starts is joined
// before the subtest ends. Time moves only through the Manual clock: there
// is no sleep, so a slow subject (a network round trip per call) is slow but
// never flaky. The whole suite makes about 5,000 calls, carrying about
// 8,000 requests.
package admissiontest

import (
	"strings"
	"testing"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Setup is what a Factory is asked to build.
type Setup struct {
	Policy policy.Policy // the policy in force at start
	Clock  *clock.Manual // the subject must read its time from this clock (and only this)
}

// Factory builds a fresh, empty subject for one (sub)test; it registers its
// own cleanup (Close) with t.Cleanup. A subject built for one test never sees
// another test's keys. A Factory that cannot build its subject fails t.
type Factory func(t *testing.T, s Setup) engine.Admitter

// behaviour is one named test of the suite.
type behaviour struct {
	name string
	run  func(t *testing.T, f Factory)
}

// estimates names the behaviours (group/name) that compare Remaining or
// ResetAfter with the model's after the clock moved, which an
// Options.Leased subject only estimates.
var estimates = map[string]bool{
	"Differential/Random": true, "Bands/Random": true, "AllowAll/Random": true,
	"Charge/WorkedExampleDebt": true, "Charge/WorkedExampleBands": true,
}

// Options states how a subject's answers differ from the engine's, as its
// own documentation says; the zero Options is none.
type Options struct {
	// Leased is for a subject that decides some requests from tokens it
	// took from a key's bucket in advance (engine/redisstore with
	// Config.Leases), or from a denial it keeps (until its RetryAfter, at
	// most Leases.MaxAge): such an answer's Remaining and ResetAfter are
	// estimated from the bucket's last answer, so the behaviours that
	// compare them with the model's after the clock moves are skipped.
	// Every other behaviour runs,
	// Allowed, RetryAfter, Version, Limit, Band and errors compared as
	// they are for the engine.
	Leased bool
}

// group is a named set of behaviours, one per section of the contract, so
// that `go test -run 'Admission/.*/Cutover'` selects a whole section.
type group struct {
	name       string
	behaviours []behaviour
}

// suite lists every behaviour. Each builds its own subjects, so none relies
// on another having run.
var suite = []group{
	{"WorkedExamples", exampleBehaviours},
	{"Errors", errorBehaviours},
	{"Cutover", cutoverBehaviours},
	{"Batch", batchBehaviours},
	{"Overrides", overrideBehaviours},
	{"CutoverChain", chainBehaviours},
	{"Differential", differentialBehaviours},
	{"Bands", bandBehaviours},
	{"AllowAll", allowAllBehaviours},
	{"Charge", chargeBehaviours},
}

// Run runs every behaviour test as a subtest of t.
func Run(t *testing.T, f Factory) {
	t.Helper()
	RunWith(t, f, Options{})
}

// RunWith is Run for a subject that differs from the engine as o states.
func RunWith(t *testing.T, f Factory, o Options) {
	t.Helper()
	for _, g := range suite {
		t.Run(g.name, func(t *testing.T) {
			for _, b := range g.behaviours {
				t.Run(b.name, func(t *testing.T) {
					if o.Leased && estimates[g.name+"/"+b.name] {
						t.Skip("compares Remaining or ResetAfter after the clock moved: a leased subject's are estimates (Options.Leased)")
					}
					b.run(t, f)
				})
			}
		})
	}
}

// Concurrent reports whether t is, or runs under, one of the behaviours
// that use their subject from several goroutines at once, whose names
// begin with Concurrent. Every other behaviour uses its subject from one
// goroutine at a time, so a Factory may skip those where only concurrency
// is of interest, as under the race detector.
func Concurrent(t *testing.T) bool {
	for _, name := range strings.Split(t.Name(), "/") {
		if strings.HasPrefix(name, "Concurrent") {
			return true
		}
	}
	return false
}

// newSubject builds a subject serving p with its own Manual clock at 0.
func newSubject(t *testing.T, f Factory, p policy.Policy) (engine.Admitter, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(0)
	a := f(t, Setup{Policy: p, Clock: clk})
	if a == nil {
		t.Fatalf("the Factory returned a nil subject for %+v", p)
	}
	return a, clk
}
