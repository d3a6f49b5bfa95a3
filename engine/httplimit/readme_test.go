package httplimit_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEQuickstartIsTheExample: the README's quickstart is the code of
// Example_quickstart, which the tests run, so the code a reader copies
// cannot rot apart from it. Line by line and in order, comments and blank
// lines aside, each README line is one of the Example's, but for the two
// differences a real program has: it ends on log.Fatal where the Example
// panics, and it serves with http.ListenAndServe where the Example starts
// an httptest server (and names that call beside it).
func TestREADMEQuickstartIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Quickstart\n")
	require.True(t, ok, "the README has no Quickstart section")
	_, block, ok := strings.Cut(section, "```go\n")
	require.True(t, ok, "the README's Quickstart has no Go block")
	block, _, ok = strings.Cut(block, "\n```")
	require.True(t, ok, "the README's Quickstart block is not closed")

	example, err := os.ReadFile("quickstart_example_test.go")
	require.NoError(t, err)
	_, body, ok := strings.Cut(string(example), "\nfunc Example_quickstart() {\n")
	require.True(t, ok, "no Example_quickstart")
	body, _, ok = strings.Cut(body, "\n}\n")
	require.True(t, ok, "Example_quickstart does not end")

	const serve = `log.Fatal(http.ListenAndServe(":8080", mw.Handler(mux)))`
	require.Contains(t, body, "// "+strings.TrimSuffix(strings.TrimPrefix(serve, "log.Fatal("), ")"),
		"the Example names the call the README serves with")
	want := codeLines(body)
	next, served := 0, false
	matched := map[int]bool{}
	for _, line := range codeLines(block) {
		if line == serve {
			served = true
			continue
		}
		line = strings.ReplaceAll(line, "log.Fatal(err)", "panic(err)")
		for next < len(want) && want[next] != line {
			next++
		}
		require.Less(t, next, len(want), "the README's quickstart line %q is not the Example's (in order)", line)
		matched[next] = true
		next++
	}
	require.True(t, served, "the README's quickstart does not serve")
	// And the other way: every line of the Example before it starts its
	// test server is in the README, so the README leaves out no step.
	for i, line := range want {
		if strings.HasPrefix(line, "srv := httptest.NewServer(") {
			break
		}
		require.True(t, matched[i], "the Example's line %q is not in the README's quickstart", line)
	}
}

// codeLines returns src's lines trimmed, without line comments and blank
// lines. A "//" inside a string literal would be cut too; the quickstart
// has none.
func codeLines(src string) []string {
	var lines []string
	for _, line := range strings.Split(src, "\n") {
		line, _, _ = strings.Cut(line, "//")
		if line = strings.TrimSpace(line); line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}
