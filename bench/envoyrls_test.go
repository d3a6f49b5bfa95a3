package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/internal/redistest"
)

// tinyRLSTimes makes the envoyrls part's cells last milliseconds for the
// test: the table's shape is checked, not its figures. Under the race
// detector too, which checks the harness's goroutines, if not its timing.
func tinyRLSTimes(t *testing.T) {
	old := rlsTimesFor
	rlsTimesFor = func(bool) rlsTimes {
		return rlsTimes{grpc: 20 * time.Millisecond, local: 5 * time.Millisecond, warm: 10 * time.Millisecond, rounds: 3}
	}
	t.Cleanup(func() { rlsTimesFor = old })
}

// rlsTableRows returns the envoyrls table's rows as "callers/descriptors/
// call/answered by", in order.
func rlsTableRows(out string) []string {
	var rows []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "|")
		if len(f) != 10 || strings.TrimSpace(f[1]) == "CALLERS" {
			continue
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		rows = append(rows, strings.Join(f[1:5], "/"))
	}
	return rows
}

// wantRLSRows is the table's rows: per group of callers and descriptors,
// the always-OK server and envoyrls on each admitter over gRPC, then
// envoyrls on each admitter in process.
func wantRLSRows(admitters ...string) []string {
	var want []string
	for _, callers := range rlsCallers {
		for _, n := range []int{1, 3} {
			want = append(want, fmt.Sprintf("%d/%d/gRPC loopback/always OK", callers, n))
			for _, a := range admitters {
				want = append(want, fmt.Sprintf("%d/%d/gRPC loopback/envoyrls on %s", callers, n, a))
			}
			for _, a := range admitters {
				want = append(want, fmt.Sprintf("%d/%d/in process/envoyrls on %s", callers, n, a))
			}
		}
	}
	return want
}

// TestEnvoyRLSPart runs `bench -parts envoyrls` without Redis, with tiny
// durations, so the command cannot rot: every row there, every request
// admitted, and the Redis rows said to be skipped.
func TestEnvoyRLSPart(t *testing.T) {
	skipUnderRace(t)
	tinyRLSTimes(t)
	var out bytes.Buffer
	if code := run([]string{"-quick", "-parts", "envoyrls"}, &out, &out); code != 0 {
		t.Fatalf("bench -parts envoyrls exited %d:\n%s", code, out.String())
	}
	got := out.String()
	if rows, want := rlsTableRows(got), wantRLSRows("engine"); !slices.Equal(rows, want) {
		t.Errorf("rows\n%s\nwant\n%s\noutput:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"), got)
	}
	for _, want := range []string{"ENVOYRLS SHOULDRATELIMIT", "Redis rows skipped; measure them with -redis ADDR"} {
		if !strings.Contains(strings.ToUpper(got), strings.ToUpper(want)) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "WARNING") {
		t.Errorf("a request was not admitted:\n%s", got)
	}
}

// TestEnvoyRLSPartRedis runs it with -redis: the store's rows beside the
// engine's, no fail-closed answer or refusal, and every key it wrote deleted.
func TestEnvoyRLSPartRedis(t *testing.T) {
	skipUnderRace(t)
	addr := redistest.Alone(t)
	tinyRLSTimes(t)
	var out bytes.Buffer
	if code := run([]string{"-quick", "-parts", "envoyrls", "-redis", addr}, &out, &out); code != 0 {
		t.Fatalf("bench -parts envoyrls -redis exited %d:\n%s", code, out.String())
	}
	got := out.String()
	if rows, want := rlsTableRows(got), wantRLSRows("engine", "redisstore"); !slices.Equal(rows, want) {
		t.Errorf("rows\n%s\nwant\n%s\noutput:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"), got)
	}
	if strings.Contains(got, "WARNING") || strings.Contains(got, "skipped") {
		t.Errorf("the run met refusals or failures, or skipped Redis:\n%s", got)
	}
	requireNothingLeft(t, got, addr)
}
