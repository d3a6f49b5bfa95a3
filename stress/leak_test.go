package main

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// withCheck runs f with c added to the checks the command knows.
func withCheck(t *testing.T, c check, f func()) {
	saved := checks
	checks = append(slices.Clone(saved), c)
	defer func() { checks = saved }()
	f()
}

// TestRunChecksReportsLeftGoroutine: a check that leaves a goroutine
// running (as an engine whose Close left one would) fails the run, with
// the goroutine's stack; the command reported such a run clean, though its
// doc says it checks that nothing leaks a goroutine.
func TestRunChecksReportsLeftGoroutine(t *testing.T) {
	saved := leakGrace
	leakGrace = 100 * time.Millisecond // the leak is there from the start: no grace finds it gone
	defer func() { leakGrace = saved }()
	release := make(chan struct{})
	defer close(release) // the goroutine ends before TestMain's own leak check
	leaky := check{"leaky", func(ctx context.Context, o options, c *counters) error {
		go func() { <-release }()
		return nil
	}}
	withCheck(t, leaky, func() {
		var out bytes.Buffer
		o := options{duration: 100 * time.Millisecond, seed: 1, checks: []string{"leaky"}}
		assert.Equal(t, 1, runChecks(context.Background(), o, &out), out.String())
		assert.Regexp(t, `(?m)^\| goroutines +\| VIOLATION +\|`, out.String())
		assert.Contains(t, out.String(), "FIRST VIOLATION: goroutines violation (seed 1)")
		assert.Contains(t, out.String(), "goroutines still running: 1")
		assert.Contains(t, out.String(), "TestRunChecksReportsLeftGoroutine", "the stack of the goroutine left")
	})
}

// TestRunChecksGoroutinesEnded: a check whose goroutines have all ended by
// the time it returns passes the leak check.
func TestRunChecksGoroutinesEnded(t *testing.T) {
	tidy := check{"tidy", func(ctx context.Context, o options, c *counters) error {
		done := make(chan struct{})
		go func() { close(done) }()
		<-done
		return nil
	}}
	withCheck(t, tidy, func() {
		var out bytes.Buffer
		o := options{duration: 100 * time.Millisecond, seed: 1, checks: []string{"tidy"}}
		assert.Equal(t, 0, runChecks(context.Background(), o, &out), out.String())
		assert.Regexp(t, `(?m)^\| goroutines +\| ok +\|`, out.String())
	})
}
