//go:build race

package policy_test

const raceEnabled = true
