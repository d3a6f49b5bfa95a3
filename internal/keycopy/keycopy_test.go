package keycopy

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestCopies: every draw equals its pick's name, none shares the name's
// bytes, and the copies lie back to back in pick order.
func TestCopies(t *testing.T) {
	names := []string{"a", "bb", "ccc"}
	picks := []int{2, 0, 1, 2, 1}
	got := Copies(names, picks)
	require.Len(t, got, len(picks))
	next := unsafe.StringData(got[0])
	for i, p := range picks {
		require.Equal(t, names[p], got[i])
		require.NotSame(t, unsafe.StringData(names[p]), unsafe.StringData(got[i]))
		require.Same(t, next, unsafe.StringData(got[i]), "copy %d follows copy %d", i, i-1)
		next = (*byte)(unsafe.Add(unsafe.Pointer(next), len(got[i])))
	}
}
