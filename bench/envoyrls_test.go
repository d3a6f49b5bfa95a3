package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestEnvoyRLSPart runs `bench -parts envoyrls` on the smallest setting, so
// the command cannot rot.
func TestEnvoyRLSPart(t *testing.T) {
	if raceEnabled {
		t.Skip("timing under the race detector says nothing; `go test work` without -race runs it")
	}
	var out bytes.Buffer
	if code := run([]string{"-quick", "-cpu", "1", "-parts", "envoyrls"}, &out, &out); code != 0 {
		t.Fatalf("bench -parts envoyrls exited %d:\n%s", code, out.String())
	}
	for _, want := range []string{"envoyrls ShouldRateLimit on the engine", "GRPC LOOPBACK"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
