package policy_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind. Package policy
// starts none, so any leak is a test bug; no goroutine is ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// skipUnderRace skips a sequential check (against the math/big model, or
// over many limits) under the race detector: package policy starts no
// goroutine, nor do its tests, so the detector finds nothing there, and the
// check runs ten times slower. `go test work` without -race runs it, and
// so does CI, after the race step.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("a sequential check: `go test work` without -race runs it")
	}
}
