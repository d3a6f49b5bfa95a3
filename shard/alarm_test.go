package shard

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestAlarm: an alarm rings at the first reading at or after its time, once
// however many readings pass it before it is read, and never while off.
func TestAlarm(t *testing.T) {
	a := NewAlarm()
	rang := func() bool {
		select {
		case <-a.C():
			return true
		default:
			return false
		}
	}
	a.check(math.MaxInt64 - 1)
	assert.False(t, rang(), "a new alarm is off")
	a.Set(100)
	a.check(99)
	assert.False(t, rang(), "before its time")
	a.check(100)
	assert.True(t, rang(), "at its time, not only past it")
	a.check(150)
	a.check(160)
	assert.True(t, rang(), "past its time")
	assert.False(t, rang(), "two readings past it are one ring")
	a.Set(math.MaxInt64)
	a.check(200)
	assert.False(t, rang(), "switched off")
}
