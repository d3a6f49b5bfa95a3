package msg

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCountersAdd: adding one shard's counters to a total sums every count
// but HighWater, a maximum: the total's is the largest of any shard's, as
// Stats reports it, not the sum of peaks reached at different instants.
func TestCountersAdd(t *testing.T) {
	var total, a, b Counters
	for i := range a {
		a[i], b[i] = uint64(10+i), uint64(100+i)
	}
	a[HighWater], b[HighWater] = 7, 3
	total.Add(&a)
	total.Add(&b)
	for i := range total {
		if Counter(i) == HighWater {
			assert.Equal(t, uint64(7), total[i], "HighWater: the largest")
			continue
		}
		assert.Equal(t, a[i]+b[i], total[i], "counter %d: the sum", i)
	}
}
