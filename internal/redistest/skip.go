package redistest

import (
	"os"
	"testing"
)

const (
	// envAddr names the variable that points tests at a Redis server the
	// user chose; Addr fails the test if it does not answer.
	envAddr = "TOKENSHARD_REDIS_ADDR"
	// envRequire names the variable that, set to 1, turns "no Redis" from a
	// skip into a failure. CI sets it.
	envRequire = "TOKENSHARD_REQUIRE_REDIS"
)

// noRedisMessage is what a test prints when it cannot get a Redis server.
// It is loud on purpose: a skipped integration test is easy to miss.
const noRedisMessage = `
************************************************************************
*** REDIS INTEGRATION TESTS DID NOT RUN ***
%s
To run them, do one of:
  - apt-get install redis-server   (Debian/Ubuntu; the tests then start a
    private redis-server themselves, or use one on 127.0.0.1:6379)
  - export ` + envAddr + `=host:port   (a Redis you own: tests write keys)
Set ` + envRequire + `=1 to make this a failure instead of a skip (CI does).
************************************************************************`

// skipOrFail ends the test because no Redis server can be had: a skip,
// or a failure under TOKENSHARD_REQUIRE_REDIS=1.
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(envRequire) == "1" {
		t.Fatalf(noRedisMessage+"\n%s=1, so this is a failure.", why, envRequire)
		return // Fatalf has ended the test; this is for a TB that records
	}
	t.Skipf(noRedisMessage, why)
}
