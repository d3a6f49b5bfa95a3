package main

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"go.uber.org/goleak"
)

// The command's leak check. Every check closes its engines and stores
// before it returns, and the contract says no goroutine outlives Close; so
// once every check has ended, the process must run only the goroutines it
// ran before they started. The package's tests hold this with goleak in
// TestMain; this is the same check for the command's long runs, which
// otherwise would report an engine whose Close leaves a goroutine as clean.

// leakCheckName is the row the summary gives the leak check.
const leakCheckName = "goroutines"

// leakDetailLines bounds the stacks a leak report prints: an engine that
// leaks leaks once per engine, and a run makes hundreds.
const leakDetailLines = 60

// leakGoroutine starts each goroutine's entry in goleak's report.
var leakGoroutine = regexp.MustCompile(`(?m)^[\[ ]?Goroutine \d+ in state `)

// leakBaseline returns what checkLeaks ignores: the goroutines running now.
func leakBaseline() goleak.Option { return goleak.IgnoreCurrent() }

// leakGrace is how long a goroutine may take to end after its check
// returned: a go-redis pool that failed to dial a killed server redials
// after a pause of a second, and sees its client's Close only then.
var leakGrace = 3 * time.Second // a variable: the test of a leak shortens it

// checkLeaks returns a violation if a goroutine that base did not ignore
// is still running leakGrace after it is called, else nil.
func checkLeaks(base goleak.Option, seed uint64) *Violation {
	var err error
	for deadline := time.Now().Add(leakGrace); ; {
		// Find itself waits a moment, up to half a second, for stragglers.
		if err = goleak.Find(base); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
	}
	msg := err.Error()
	n := len(leakGoroutine.FindAllStringIndex(msg, -1))
	lines := strings.Split(msg, "\n")
	if len(lines) > leakDetailLines {
		lines = append(lines[:leakDetailLines], fmt.Sprintf("... and %d lines more", len(lines)-leakDetailLines))
	}
	return &Violation{
		Check:  leakCheckName,
		Op:     "every check ended, its engines and stores closed",
		Want:   "no goroutine left but those running before the checks started",
		Got:    fmt.Sprintf("goroutines still running: %d", n),
		Seed:   seed,
		Detail: strings.Join(lines, "\n"),
	}
}
