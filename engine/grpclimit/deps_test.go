package grpclimit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestEngineDependsOnNoTransport: gRPC (and the protobuf runtime it brings)
// and the Prometheus client are dependencies of their adapter packages
// only; package engine, and so every user of it, builds without them.
func TestEngineDependsOnNoTransport(t *testing.T) {
	const pkg = "github.com/tokenshard/tokenshard/engine"
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 || deps[len(deps)-1] != pkg {
		t.Fatalf("%s is not in go list's output:\n%s", pkg, out)
	}
	for _, d := range deps {
		for _, banned := range []string{"google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto", "github.com/prometheus/"} {
			if strings.HasPrefix(d, banned) {
				t.Errorf("package engine depends on %s", d)
			}
		}
	}
}
