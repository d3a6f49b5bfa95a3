package msg

import (
	"testing"
	"unsafe"
)

// TestSingleFitsTwoLines holds a single request's message to exactly 128
// bytes on 64-bit platforms: the size class whose objects start on a
// 128-byte boundary, so that it lies on two cache lines (see Single). A
// smaller message would fall in a size class of 80, 96 or 112 bytes, whose
// objects straddle lines.
func TestSingleFitsTwoLines(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is tuned for 64-bit platforms")
	}
	if n := unsafe.Sizeof(Single{}); n != 128 {
		t.Errorf("Single takes %d bytes, not the 128 of two cache lines", n)
	}
}
