package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBadFlagsRefused: a command line the command cannot honour exits 2
// with a message naming what is wrong, before it measures anything. Each
// case asks only for the Redis part, skipped without -redis, so a case the
// command wrongly accepts ends at once with 0.
func TestBadFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-cpu", "0"}, `bad -cpu value "0"`},
		{[]string{"-cpu", "1,x"}, `bad -cpu value "x"`},
		{[]string{"-cpu", "1,,2"}, `bad -cpu value ""`},
		{[]string{"-cpu", "2,1,2"}, "-cpu value 2 given twice"},
		{[]string{"-parts", "redis,nosuch"}, `unknown part "nosuch"`},
		{[]string{"-parts", "redis,"}, `unknown part ""`},
		{[]string{"-redis", "a:1", "-redis-cluster", "b:1"}, "exclude each other"},
		{[]string{"-nosuch"}, "flag provided but not defined"},
		{[]string{"quick"}, `unexpected argument "quick"`},
		{[]string{"-quick", "-cpu", "1", "decisions"}, `unexpected argument "decisions"`},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"-parts", "redis"}, c.args...)
		if code := run(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("bench %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(args, " "), code, stderr.String(), c.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("bench %s: wrote %q to stdout before refusing", strings.Join(args, " "), stdout.String())
		}
	}
}
