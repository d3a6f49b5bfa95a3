package promstats_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: no
// ignores, because closed engines and collected registries own none.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
