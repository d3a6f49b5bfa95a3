package expvarstats_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: no
// ignores, because a closed engine owns none.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
