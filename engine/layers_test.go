package engine_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportLayers holds the import layers: policy and clock use
// only the standard library, msg may use policy, shard may use msg, policy
// and clock, and nothing but engine imports shard or msg. A wrong import
// fails here rather than in review. internal/yield sits at the bottom with
// policy and clock, on the standard library alone, for msg and shard.
func TestImportLayers(t *testing.T) {
	const mod = "github.com/tokenshard/tokenshard/"
	allowed := map[string][]string{
		"policy":         {},
		"clock":          {},
		"internal/yield": {},
		"internal/model": {"policy", "clock"},
		"msg":            {"policy", "internal/yield"},
		"shard":          {"msg", "policy", "clock", "internal/yield"},
		"engine":         {"msg", "policy", "clock", "shard"},
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		rules, layered := allowed[pkg]
		if layered {
			seen++
		}
		for _, imp := range fields[1:] {
			inner, internal := strings.CutPrefix(imp, mod)
			switch {
			case internal && (inner == "shard" || inner == "msg") && !layered:
				t.Errorf("%s imports %s: only engine may", pkg, inner)
			case internal && layered && !slices.Contains(rules, inner):
				t.Errorf("%s imports %s, outside its layer (allowed: %v)", pkg, inner, rules)
			case !internal && (pkg == "policy" || pkg == "clock" || pkg == "internal/yield" || pkg == "internal/model") && strings.Contains(strings.Split(imp, "/")[0], "."):
				t.Errorf("%s imports %s: it may use only the standard library", pkg, imp)
			}
		}
	}
	if seen != len(allowed) {
		t.Errorf("found %d of the %d layered packages in go list's output:\n%s", seen, len(allowed), out)
	}
}

// TestNoImportUpward: the library (engine, its sub-packages and internal/)
// never imports the stress or bench commands, and the model
// (internal/model) never the engine, its shards or their messages, tests
// included: a package's tests may not lean on a layer above it either.
func TestNoImportUpward(t *testing.T) {
	const mod = "github.com/tokenshard/tokenshard/"
	rules := []struct{ from, to []string }{
		{[]string{"engine", "internal"}, []string{"stress", "bench"}},
		{[]string{"internal/model"}, []string{"engine", "shard", "msg"}},
	}
	under := func(pkg string, roots []string) bool {
		return slices.ContainsFunc(roots, func(r string) bool { return pkg == r || strings.HasPrefix(pkg, r+"/") })
	}
	out, err := exec.Command("go", "list", "-f",
		"{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}",
		mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		seen[pkg] = true
		for _, imp := range fields[1:] {
			inner, internal := strings.CutPrefix(imp, mod)
			for _, r := range rules {
				if internal && under(pkg, r.from) && under(inner, r.to) {
					t.Errorf("%s imports %s: %v may not import %v", pkg, inner, r.from, r.to)
				}
			}
		}
	}
	if !seen["engine"] || !seen["internal/model"] {
		t.Errorf("engine and internal/model not both in go list's output:\n%s", out)
	}
}

// TestPeersOnlyInBench holds the rule that the peers and measurement
// libraries stay out of the library: no package outside bench/ and stress/
// depends on them, directly or through another package.
func TestPeersOnlyInBench(t *testing.T) {
	const mod = "github.com/tokenshard/tokenshard/"
	peers := []string{
		"golang.org/x/time/", "github.com/sethvargo/go-limiter",
		"github.com/anishathalye/porcupine", "github.com/HdrHistogram/",
		"github.com/jedib0t/go-pretty/",
	}
	all, err := exec.Command("go", "list", mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var lib []string
	for _, p := range strings.Fields(string(all)) {
		if inner := strings.TrimPrefix(p, mod); !strings.HasPrefix(inner, "bench") && !strings.HasPrefix(inner, "stress") {
			lib = append(lib, p)
		}
	}
	if !slices.Contains(lib, mod+"engine") {
		t.Fatalf("the library's packages were not found in go list's output:\n%s", all)
	}
	deps, err := exec.Command("go", append([]string{"list", "-deps"}, lib...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, d := range strings.Fields(string(deps)) {
		for _, p := range peers {
			if strings.HasPrefix(d, p) {
				t.Errorf("the library depends on %s (only bench/ and stress/ may)", d)
			}
		}
	}
}
