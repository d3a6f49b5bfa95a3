package engine_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestImportLayers holds the import layers: policy and clock use
// only the standard library, msg may use policy, shard may use msg, policy
// and clock, and nothing but engine imports shard or msg. A wrong import
// fails here rather than in review. internal/yield and internal/decision
// sit at the bottom with policy and clock, on the standard library alone:
// the first for msg and shard, the second (the fields of a decision) for
// them, the model and the engine that converts it.
func TestImportLayers(t *testing.T) {
	const mod = "github.com/tokenshard/tokenshard/"
	allowed := map[string][]string{
		"policy":            {},
		"clock":             {},
		"internal/yield":    {},
		"internal/decision": {},
		"internal/model":    {"policy", "clock", "internal/decision"},
		"msg":               {"policy", "internal/yield", "internal/decision"},
		"shard":             {"msg", "policy", "clock", "internal/yield", "internal/decision"},
		"engine":            {"msg", "policy", "clock", "shard", "internal/decision"},
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
			case !internal && (pkg == "policy" || pkg == "clock" || pkg == "internal/yield" || pkg == "internal/decision" || pkg == "internal/model") && strings.Contains(strings.Split(imp, "/")[0], "."):
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

// TestRootModuleIsLight holds the root module to the three dependencies of
// its design: its go.mod requires xxhash, goleak and testify directly and
// nothing else, and no package of it, tests included, depends on a module
// that an adapter, bench or stress brings (those are modules of their own,
// so a service that imports the core never sees them in its module graph).
func TestRootModuleIsLight(t *testing.T) {
	out, err := exec.Command("go", "mod", "edit", "-json", "../go.mod").Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct {
		Module  struct{ Path string }
		Require []struct {
			Path     string
			Indirect bool
		}
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatalf("go mod edit -json: %v\n%s", err, out)
	}
	if mod.Module.Path != "github.com/tokenshard/tokenshard" {
		t.Fatalf("../go.mod is module %q, not the root module", mod.Module.Path)
	}
	var direct []string
	for _, r := range mod.Require {
		if !r.Indirect {
			direct = append(direct, r.Path)
		}
	}
	slices.Sort(direct)
	want := []string{"github.com/cespare/xxhash/v2", "github.com/stretchr/testify", "go.uber.org/goleak"}
	if !slices.Equal(direct, want) {
		t.Errorf("the root module requires %v directly; want exactly %v", direct, want)
	}

	// ./... from the root matches the root module's packages only, in a
	// workspace too: nested modules are not below it.
	cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{with .Module}}{{.Path}}{{end}}", "./...")
	cmd.Dir = ".."
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps -test ./...: %v", err)
	}
	heavy := []string{
		"google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto",
		"github.com/prometheus/", "github.com/redis/go-redis", "github.com/go-redis/",
		"github.com/sethvargo/go-limiter", "golang.org/x/time", "github.com/anishathalye/porcupine",
		"github.com/HdrHistogram/", "github.com/jedib0t/go-pretty",
		"github.com/tokenshard/tokenshard/",
	}
	mods := strings.Fields(string(out))
	if !slices.Contains(mods, "github.com/cespare/xxhash/v2") {
		t.Fatalf("xxhash is not among the root packages' modules:\n%s", out)
	}
	for _, m := range mods {
		for _, h := range heavy {
			if strings.HasPrefix(m, h) {
				t.Errorf("a package of the root module depends on module %s", m)
			}
		}
	}
}

// TestShardExportsOnlyWhatEngineUses holds the wall around package shard:
// it is internal to tokenshard, so every name it exports (a top-level
// name, a method, a field of an exported struct) is one that package
// engine, its code or its tests, selects or sets by name. A name only
// shard itself uses belongs unexported, where go doc does not show it.
// Names are matched by identifier, not by type: a name another type of
// engine's shares passes. A name used only in ways the parse does not see
// (a field set in a positional literal, a method reached through an
// interface) would be reported falsely.
func TestShardExportsOnlyWhatEngineUses(t *testing.T) {
	parse := func(dir string, tests bool) []*ast.File {
		t.Helper()
		paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(paths) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		var files []*ast.File
		fset := token.NewFileSet()
		for _, p := range paths {
			if !tests && strings.HasSuffix(p, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		return files
	}
	exported := map[string]bool{}
	for _, f := range parse("../shard", false) {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				exported[d.Name.Name] = d.Name.IsExported()
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							exported[n.Name] = n.IsExported()
						}
					case *ast.TypeSpec:
						exported[s.Name.Name] = s.Name.IsExported()
						if st, ok := s.Type.(*ast.StructType); ok && s.Name.IsExported() {
							for _, field := range st.Fields.List {
								for _, n := range field.Names {
									exported[n.Name] = n.IsExported()
								}
							}
						}
					}
				}
			}
		}
	}
	used := map[string]bool{}
	for _, f := range parse(".", true) {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				used[n.Sel.Name] = true
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok {
					used[id.Name] = true
				}
			}
			return true
		})
	}
	var unused []string
	for name, exp := range exported {
		if exp && !used[name] {
			unused = append(unused, name)
		}
	}
	slices.Sort(unused)
	if len(unused) > 0 {
		t.Errorf("shard exports names engine never uses (unexport them): %v", unused)
	}
}

// TestTimeReadThroughClock: engine and every package below it in the tree
// (the adapters, the Redis store) read the time through package clock
// only, never time.Now, time.Since or time.Until, so that a Manual clock
// drives all of it; timers that only wait are not readings and stay.
func TestTimeReadThroughClock(t *testing.T) {
	reads := map[string]bool{"Now": true, "Since": true, "Until": true}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if imp.Path.Value != `"time"` {
				continue
			}
			name := "time"
			if imp.Name != nil {
				name = imp.Name.Name
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok && reads[sel.Sel.Name] {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == name {
						t.Errorf("%s: time.%s: read the time through package clock", fset.Position(sel.Pos()), sel.Sel.Name)
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDocsSelfContained: no Go, Lua, assembly or Markdown file of the
// repository points its reader at a design document, style notes or lab
// notes that live outside it; the package docs are the specification. The
// names are matched in any case, and built at run time so that this file
// does not match itself.
func TestDocsSelfContained(t *testing.T) {
	outside := []string{"DES" + "IGN", "DES" + "IGN.MD", "PERF-" + "NOTES", "PERF_" + "NOTES", "STYLE" + ".MD"}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".lua", ".s", ".md":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			for j, w := range outside {
				if j == 0 && strings.Contains(line, w) || j > 0 && strings.Contains(strings.ToUpper(line), w) {
					t.Errorf("%s:%d cites %s, a document outside the repository: %s", path, i+1, w, strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
