package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/internal/redistest"
)

// stopRedis stops the Redis server redistest may have started for the
// Redis differential tests, after the tests and before the leak check.
type stopRedis struct{ m *testing.M }

func (s stopRedis) Run() int { defer redistest.Stop(); return s.m.Run() }

// TestMain fails the package if a check leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(stopRedis{m}) }
