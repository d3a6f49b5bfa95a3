//go:build !unix

package redistest

import "errors"

// redis-server runs only on Unix. Elsewhere the package still compiles, so
// that go vet ./... and go test ./... work there, and a test that kills or
// freezes a node fails with this error.
var errNoSignals = errors.New("redistest: signalling a process needs a Unix system")

func kill(int) error   { return errNoSignals }
func freeze(int) error { return errNoSignals }
func thaw(int) error   { return errNoSignals }
