package engine

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
)

// TestBatchLayout: AllowBatch hands the caller's requests and results to the
// shards as msg.Request and msg.Reply (see requests and replies), which is
// only sound while each pair has the same fields at the same offsets.
func TestBatchLayout(t *testing.T) {
	for _, pair := range [][2]reflect.Type{
		{reflect.TypeFor[Request](), reflect.TypeFor[msg.Request]()},
		{reflect.TypeFor[Result](), reflect.TypeFor[msg.Reply]()},
		{reflect.TypeFor[Decision](), reflect.TypeFor[msg.Decision]()},
	} {
		ours, theirs := pair[0], pair[1]
		require.Equal(t, ours.Size(), theirs.Size(), ours.Name())
		require.Equal(t, ours.Align(), theirs.Align(), ours.Name())
		require.Equal(t, ours.NumField(), theirs.NumField(), ours.Name())
		for i := range ours.NumField() {
			a, b := ours.Field(i), theirs.Field(i)
			require.Equal(t, a.Name, b.Name, ours.Name())
			require.Equal(t, a.Offset, b.Offset, "%s.%s", ours.Name(), a.Name)
			require.Equal(t, a.Type.Size(), b.Type.Size(), "%s.%s", ours.Name(), a.Name)
			require.Equal(t, a.Type.Kind(), b.Type.Kind(), "%s.%s", ours.Name(), a.Name)
		}
	}
}
