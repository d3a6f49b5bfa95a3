// Package expvarstats publishes an engine's counters through the standard
// library's expvar package, so /debug/vars (expvar's handler) serves them
// as JSON: each read of the variable is one engine.Engine.Stats, which
// never blocks admission (Stats says why). For Prometheus, see package
// engine/promstats instead.
package expvarstats

import (
	"expvar"
	"fmt"
	"sync"

	"github.com/tokenshard/tokenshard/engine"
)

// Publish makes e's Stats readable through expvar under name: expvar.Get(name)
// then reports e.Stats() as JSON, every time it is read, during and after
// e's Close. A name already published is an error wrapping
// engine.ErrInvalidConfig, since expvar names are process-wide and cannot be
// withdrawn. A nil or zero Engine publishes nothing and returns
// engine.ErrNotInitialized.
func Publish(name string, e *engine.Engine) error {
	if e == nil || e.MaxKeys() == 0 { // an Engine made by New has a key bound of at least 1
		return engine.ErrNotInitialized
	}
	mu.Lock() // expvar.Publish panics on a name taken between check and publish
	defer mu.Unlock()
	if expvar.Get(name) != nil || !publish(name, expvar.Func(func() any { return e.Stats() })) {
		return fmt.Errorf("%w: expvar %q is already published", engine.ErrInvalidConfig, name)
	}
	return nil
}

// mu serializes Publish's check and publish, which expvar does not do as one.
var mu sync.Mutex

// publish publishes v under name and reports whether it did. mu only
// serializes Publish's own callers: another package may publish the same
// name between Publish's check and its publish, and expvar.Publish then
// panics (after logging the name), having changed nothing.
func publish(name string, v expvar.Var) (ok bool) {
	defer func() {
		if !ok {
			_ = recover()
		}
	}()
	expvar.Publish(name, v)
	return true
}
