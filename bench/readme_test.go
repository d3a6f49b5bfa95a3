package main

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestREADMEPerformanceTable: the README's performance table is one the
// command prints: its rows are contenders' names and its columns the
// decisions table's, as the command writes them, and each ratio is the
// row's figure over the best peer's in its column (a single request's over
// the peers deciding one a call, a batch's over every peer), to the two
// decimals the command prints.
func TestREADMEPerformanceTable(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n## Performance")
	if i < 0 {
		t.Fatal("README has no Performance section")
	}
	var rows [][]string
	for _, line := range strings.Split(text[i:], "\n") {
		if strings.HasPrefix(line, "|") {
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for j := range cells {
				cells[j] = strings.TrimSpace(cells[j])
			}
			rows = append(rows, cells)
		} else if len(rows) > 0 {
			break
		}
	}
	if len(rows) < 3 {
		t.Fatalf("README's performance table has %d rows", len(rows))
	}
	columns := map[string]bool{}
	for _, s := range scenarios {
		for _, cpu := range []int{1, 2} {
			columns[fmt.Sprintf("%s cpu=%d", s.name, cpu)] = true
		}
	}
	header := rows[0][1:]
	for _, h := range header {
		if !columns[h] {
			t.Errorf("README's column %q is not one the command prints", h)
		}
	}
	byName := map[string]contender{}
	for _, c := range contenders {
		byName[c.name] = c
	}
	cell := regexp.MustCompile(`^(\d+)(?: \((\d+\.\d\d)x\))?$`)
	type fig struct {
		ns    float64
		ratio string
	}
	figs := map[string][]fig{}
	var order []string
	for _, r := range rows[2:] {
		c, ok := byName[r[0]]
		if !ok {
			t.Errorf("README's row %q is not a contender the command prints", r[0])
			continue
		}
		if len(r) != len(rows[0]) {
			t.Fatalf("README's row %q has %d cells, the header %d", r[0], len(r), len(rows[0]))
		}
		for _, v := range r[1:] {
			m := cell.FindStringSubmatch(v)
			if m == nil {
				t.Fatalf("README's row %q: cell %q is not \"ns\" or \"ns (ratio x)\"", r[0], v)
			}
			ns, _ := strconv.ParseFloat(m[1], 64)
			figs[c.name] = append(figs[c.name], fig{ns, m[2]})
		}
		order = append(order, c.name)
	}
	for j := range header {
		best := map[bool]float64{false: math.Inf(1), true: math.Inf(1)}
		for _, name := range order {
			if c := byName[name]; c.peer {
				v := figs[name][j].ns
				best[true] = min(best[true], v)
				if c.batch == 1 {
					best[false] = min(best[false], v)
				}
			}
		}
		for _, name := range order {
			f := figs[name][j]
			if f.ratio == "" {
				continue
			}
			peer := best[byName[name].batch > 1]
			want := f.ns / peer
			// Both figures are rounded to whole ns, and the ratio to two
			// decimals: the ratio of the unrounded figures may differ by
			// that much.
			got, _ := strconv.ParseFloat(f.ratio, 64)
			if math.Abs(got-want) > 0.005+want*(0.5/f.ns+0.5/peer) {
				t.Errorf("README's %s / %s: %v (%sx), but %v over the best peer's %v is %.2fx", name, header[j], f.ns, f.ratio, f.ns, peer, want)
			}
		}
	}
}
