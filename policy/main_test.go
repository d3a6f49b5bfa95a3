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
