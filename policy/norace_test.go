//go:build !race

package policy_test

const raceEnabled = false
