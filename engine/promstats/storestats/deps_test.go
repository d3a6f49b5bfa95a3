package storestats_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoCrossDependency: engine/promstats does not depend on go-redis, and
// engine/redisstore does not depend on Prometheus, directly or through
// another package; only this package links both.
func TestNoCrossDependency(t *testing.T) {
	for _, tc := range []struct{ pkg, banned string }{
		{"github.com/tokenshard/tokenshard/engine/promstats", "github.com/redis/go-redis"},
		{"github.com/tokenshard/tokenshard/engine/redisstore", "github.com/prometheus"},
	} {
		out, err := exec.Command("go", "list", "-deps", tc.pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", tc.pkg, err)
		}
		found := false
		for _, d := range strings.Fields(string(out)) {
			found = found || d == tc.pkg
			if strings.HasPrefix(d, tc.banned) {
				t.Errorf("%s depends on %s", tc.pkg, d)
			}
		}
		if !found {
			t.Fatalf("%s is not in go list's output:\n%s", tc.pkg, out)
		}
	}
}
