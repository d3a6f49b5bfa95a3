package storestats_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNoCrossDependency: the module graph of engine/promstats names no
// go-redis, and that of engine/redisstore no Prometheus; only this module,
// which links both, has both. Each module is read on its own (GOWORK=off),
// as a service that requires it sees it.
func TestNoCrossDependency(t *testing.T) {
	for _, tc := range []struct {
		dir, mod string
		banned   []string
	}{
		{"..", "github.com/tokenshard/tokenshard/engine/promstats", []string{"github.com/redis/", "google.golang.org/grpc"}},
		{"../../redisstore", "github.com/tokenshard/tokenshard/engine/redisstore", []string{"github.com/prometheus/", "google.golang.org/grpc"}},
	} {
		cmd := exec.Command("go", "list", "-m", "all")
		cmd.Dir = tc.dir
		cmd.Env = append(os.Environ(), "GOWORK=off")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -m all in %s: %v", tc.dir, err)
		}
		mods := strings.Fields(string(out))
		if len(mods) == 0 || mods[0] != tc.mod {
			t.Fatalf("%s is not module %s:\n%s", tc.dir, tc.mod, out)
		}
		for _, m := range mods {
			for _, b := range tc.banned {
				if strings.HasPrefix(m, b) {
					t.Errorf("module %s has %s in its module graph", tc.mod, m)
				}
			}
		}
	}
}
