//go:build purego

package yield

import "runtime"

// Local yields the processor, as runtime.Gosched does.
func Local() { runtime.Gosched() }
