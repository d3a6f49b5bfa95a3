//go:build race

package main

// raceEnabled: the race detector slows the bench tenfold, so the end-to-end
// runs are left to the plain `go test work` that CI also runs.
const raceEnabled = true
