package storestats_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/internal/redistest"
)

type stopRedis struct{ m *testing.M }

func (s stopRedis) Run() int { defer redistest.Stop(); return s.m.Run() }

// TestMain fails the package if a test leaves a goroutine behind: go-redis
// clients are closed by each test's cleanup, the shared redis-server is
// stopped before the check, and the Collector starts none.
func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // the outage test would fill the log with go-redis's dial retries
	goleak.VerifyTestMain(stopRedis{m})
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
