// Package keycopy lays out the keys of benchmark requests the way a server
// receives them: each key a fresh copy of its bytes, not the string a
// limiter stored, and the copies in request order in one block of memory, so
// reading them in order streams them in.
package keycopy

import "strings"

// Copies returns names[picks[i]] for every i, each a copy of the name's
// bytes, laid out in pick order in one string.
func Copies(names []string, picks []int) []string {
	var all strings.Builder
	for _, p := range picks {
		all.WriteString(names[p])
	}
	buf, out := all.String(), make([]string, len(picks))
	for i, p := range picks {
		out[i], buf = buf[:len(names[p])], buf[len(names[p]):]
	}
	return out
}
