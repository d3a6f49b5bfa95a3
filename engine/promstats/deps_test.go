package promstats_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestEngineDependsOnNoExporter: engine itself depends on neither
// Prometheus nor gRPC, directly or through another package; only the
// packages that export to them do.
func TestEngineDependsOnNoExporter(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/tokenshard/tokenshard/engine").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	found := false
	for _, d := range deps {
		found = found || d == "github.com/tokenshard/tokenshard/engine"
		for _, p := range []string{"github.com/prometheus/", "google.golang.org/grpc"} {
			if strings.HasPrefix(d, p) {
				t.Errorf("engine depends on %s", d)
			}
		}
	}
	if !found {
		t.Fatalf("engine is not in go list's output:\n%s", out)
	}
}
