package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a check leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
