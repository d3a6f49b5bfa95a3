package envoyrls_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newEngine is the suite's factory for the in-process engine.
func newEngine(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
	t.Helper()
	e, err := engine.New(engine.Config{Policy: p, Clock: clk, Shards: 2})
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

func TestSuiteEngine(t *testing.T) { rlstest.Run(t, newEngine) }
