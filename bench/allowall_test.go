package main

import (
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/engine"
)

// TestAllowAllTableChecksResults: the AllowAll table's calls report a
// request not admitted, which the table warns of (a refusal or an error
// costs less than an admission, so such a figure is no comparison): none
// on the table's policy, every call on a closed engine.
func TestAllowAllTableChecksResults(t *testing.T) {
	triples := shardTriples(10)
	for _, c := range []struct {
		name string
		call func(*engine.Engine, []string) bool
	}{{"AllowAll", allowAllThree}, {"3 x Allow", allowThree}} {
		if _, refused := perCall(triples, 2, 10*time.Millisecond, c.call); refused != 0 {
			t.Errorf("%s: %d calls not admitted in full on a policy that admits all", c.name, refused)
		}
		closed := func(e *engine.Engine, ks []string) bool { _ = e.Close(); return c.call(e, ks) }
		if _, refused := perCall(triples, 2, 10*time.Millisecond, closed); refused == 0 {
			t.Errorf("%s: no call reported refused on a closed engine", c.name)
		}
	}
}
