package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/internal/redistest"
)

// tableRows returns the rows of the tables in out whose lines have cols
// columns, each as its first n cells joined by "/", the header rows left
// out.
func tableRows(out string, cols, n int) []string {
	var rows []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "|")
		if len(f) != cols+2 {
			continue
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if f[1] == strings.ToUpper(f[1]) && strings.ContainsAny(f[1], "ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
			continue // a header
		}
		rows = append(rows, strings.Join(f[1:1+n], "/"))
	}
	return rows
}

// TestLeasesPart runs `bench -quick -parts leases` on a private Redis with
// tiny windows, its workers this test binary run again (TestMain): every
// table and row there, every request admitted with no failure or error,
// a verdict on every goal, and every key it wrote deleted. The figures are
// not checked: the run is too short, and the machine may be busy.
func TestLeasesPart(t *testing.T) {
	skipUnderRace(t)
	addr := redistest.Alone(t)
	old := leaseTimesFor
	leaseTimesFor = func(bool) leaseTimes {
		return leaseTimes{warm: 20 * time.Millisecond, window: 50 * time.Millisecond, rounds: 1}
	}
	t.Cleanup(func() { leaseTimesFor = old })
	var out bytes.Buffer
	if code := run([]string{"-quick", "-parts", "leases", "-redis", addr}, &out, &out); code != 0 {
		t.Fatalf("bench -parts leases exited %d:\n%s", code, out.String())
	}
	got := out.String()

	var want []string
	for _, p := range leaseLatencyProcs {
		for _, r := range leaseLatencyRows {
			want = append(want, fmt.Sprintf("%d/%s", p, r.name))
		}
	}
	if rows := tableRows(got, 9, 2); !slices.Equal(rows, want) {
		t.Errorf("latency rows\n%s\nwant\n%s\noutput:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"), got)
	}
	want = want[:0]
	for _, r := range leaseThroughputRows {
		want = append(want, r.name+"/100.0%")
	}
	if rows := tableRows(got, 8, 3); len(rows) != len(want) {
		t.Errorf("throughput rows\n%s\nwant\n%s\noutput:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"), got)
	} else {
		for i, r := range rows {
			name, _, _ := strings.Cut(r, "/")
			_, admitted, _ := strings.Cut(r[len(name)+1:], "/")
			if name+"/"+admitted != want[i] {
				t.Errorf("throughput row %d is %q, want contender and admitted %q", i, r, want[i])
			}
		}
	}
	goals := tableRows(got, 3, 3)
	if len(goals) != 2*len(leaseLatencyProcs)+3 {
		t.Errorf("%d goal rows, want %d:\n%s", len(goals), 2*len(leaseLatencyProcs)+3, got)
	}
	for _, g := range goals {
		if !strings.HasSuffix(g, "/yes") && !strings.HasSuffix(g, "/NO") {
			t.Errorf("goal row %q has no verdict", g)
		}
	}
	for _, w := range []string{"LATENCY OF ONE ALLOW", "DECISIONS PER SECOND, 4 PROCESSES X 16 GOROUTINES", "GOALS OF LEASES"} {
		if !strings.Contains(strings.ToUpper(got), w) {
			t.Errorf("output lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "WARNING") || strings.Contains(got, "skipped") {
		t.Errorf("the run met refusals, failures or errors, or skipped Redis:\n%s", got)
	}
	requireNothingLeft(t, got, addr, rateKeyPrefix)
}

// TestLeaseWorkerLateLines: a worker that reads its lines late, here all
// at once, still measures a whole window and decides in it. When the part
// closed the window with a "stop" line, a worker the scheduler ran late on
// a loaded machine read "measure" and "stop" together and measured nothing.
func TestLeaseWorkerLateLines(t *testing.T) {
	job := leaseJob{Kind: kindEngine, Goroutines: 2, Window: 20 * time.Millisecond}
	var out bytes.Buffer
	if err := leaseWork(job, strings.NewReader("run\nmeasure\nstop\n"), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r leaseReport
	if len(lines) != 2 || lines[0] != "ready" || json.Unmarshal([]byte(lines[1]), &r) != nil {
		t.Fatalf("worker wrote %q, want ready and a report", out.String())
	}
	if r.Elapsed < job.Window || r.Decisions == 0 {
		t.Errorf("window of %s with %d decisions, want at least %s and some", r.Elapsed, r.Decisions, job.Window)
	}
}

// TestLeasesPartSkipped: without -redis the part says how to run it.
func TestLeasesPartSkipped(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-quick", "-parts", "leases"}, &out, &out); code != 0 {
		t.Fatalf("bench -parts leases exited %d:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "leases: skipped; measure redisstore's leases with -redis ADDR") {
		t.Errorf("output does not say the part was skipped:\n%s", out.String())
	}
}

// TestLeaseRoundsNoDecision: a cell whose processes made no decision in
// their windows (every call still waiting on Redis when its window closed)
// is a wrong measurement, and says so, rather than read 0.0% admitted with
// no warning; the goals table then meets no goal on its ratio.
func TestLeaseRoundsNoDecision(t *testing.T) {
	none := leaseCell{info: true}
	all := leaseCell{rate: 1000, decisions: 100, admitted: 100, info: true}
	for _, c := range []struct {
		name   string
		rounds []leaseCell
		warn   bool
	}{
		{"no decision", []leaseCell{none}, true},
		{"no decision in one round of three", []leaseCell{all, none, all}, true},
		{"every decision admitted", []leaseCell{all, all, all}, false},
	} {
		var w leaseRounds
		for _, r := range c.rounds {
			w.add(r)
		}
		got := w.warnings("throughput, redis_rate Allow")
		if said := len(got) == 1 && strings.Contains(got[0], "no decision"); said != c.warn || (!c.warn && len(got) > 0) {
			t.Errorf("%s: warnings %q, want a warning of no decision: %v", c.name, got, c.warn)
		}
	}
}

// TestLeaseGoalsNoMeasurement: a goal over a figure nothing measured (a
// latency cell that made no decision reads 0; a ratio over a throughput
// cell with no decision, or no Redis CPU read, is NaN; a ratio over a zero
// is infinite) prints "?" and is not met, where a p99 of 0 read "yes";
// measured figures are judged as before.
func TestLeaseGoalsNoMeasurement(t *testing.T) {
	render := func(g []leaseGoal) []string {
		var out bytes.Buffer
		leaseGoalsTable(&out, g)
		rows := tableRows(out.String(), 3, 3)
		if len(rows) != 2*len(leaseLatencyProcs)+3 {
			t.Fatalf("%d goal rows, want %d:\n%s", len(rows), 2*len(leaseLatencyProcs)+3, out.String())
		}
		return rows
	}
	none := map[int]float64{}
	engines := map[int]float64{}
	for _, p := range leaseLatencyProcs {
		engines[p] = 10e3
	}
	for _, c := range []struct {
		name                 string
		engines, leased, p99 map[int]float64
		vsRate, vsCPU        map[string]float64
	}{
		{"no decision anywhere", none, none, none, map[string]float64{kindRedisRate: math.NaN(), kindStore: math.NaN()}, map[string]float64{kindStore: math.NaN()}},
		{"no engine decision, ratios over zero", none, engines, none, map[string]float64{kindRedisRate: math.Inf(1), kindStore: 1 / zero()}, map[string]float64{kindStore: math.Inf(-1)}},
	} {
		for _, r := range render(leaseGoals(c.engines, c.leased, c.p99, c.vsRate, c.vsCPU)) {
			if !strings.HasSuffix(r, "/?/? (no measurement)") {
				t.Errorf("%s: goal row %q, want measured ? and met ? (no measurement)", c.name, r)
			}
		}
	}
	leased := map[int]float64{}
	for _, p := range leaseLatencyProcs {
		leased[p] = 15e3
	}
	rows := render(leaseGoals(engines, leased, leased, map[string]float64{kindRedisRate: 30, kindStore: 5}, map[string]float64{kindStore: 25}))
	var verdicts []string
	for _, r := range rows {
		verdicts = append(verdicts, r[strings.LastIndex(r, "/")+1:])
	}
	want := slices.Repeat([]string{"yes"}, 2*len(leaseLatencyProcs))
	want = append(want, "yes", "NO", "yes")
	if !slices.Equal(verdicts, want) {
		t.Errorf("verdicts %q, want %q:\n%s", verdicts, want, strings.Join(rows, "\n"))
	}
}

// zero is 0, out of the compiler's sight.
func zero() float64 { return 0 }
