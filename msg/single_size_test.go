package msg

import (
	"testing"
	"unsafe"
)

// TestSingleFitsTwoLines holds a single request's message to 128 bytes, a
// size class whose objects start on a 128-byte boundary, so that it lies
// on two cache lines (see Single).
func TestSingleFitsTwoLines(t *testing.T) {
	if n := unsafe.Sizeof(Single{}); n > 128 {
		t.Errorf("Single takes %d bytes, more than two cache lines of 64", n)
	}
}
