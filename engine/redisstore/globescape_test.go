package redisstore

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGlobEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"tokenshard:k:", "tokenshard:k:"},
		{"*?[]\\", `\*\?\[\]\\`},
		{"p*[x]?\\:", `p\*\[x\]\?\\:`},
		{"\xff:", "\xff:"},                 // not UTF-8: the byte as it is, not U+FFFD
		{"\xc3(:", "\xc3(:"},               // a truncated sequence
		{"a\x00b:", "a\x00b:"},             // NUL
		{"é^-!{}:", "é^-!{}:"},             // UTF-8, and characters special only inside a class
		{"\x80*\xfe[", "\x80\\*\xfe\\["},   // high bytes beside metacharacters
		{"\\\\\xff\\", "\\\\\\\\\xff\\\\"}, // backslashes around a high byte
	} {
		require.Equal(t, tc.want, globEscape(tc.in), "%q", tc.in)
	}
}

// FuzzGlobEscape: dropping the backslash before each escaped byte gives the
// input back, byte for byte, and no metacharacter is left unescaped.
func FuzzGlobEscape(f *testing.F) {
	for _, s := range []string{"", "\xff:", "a\x00b:", "p*[x]?\\:", "\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := globEscape(s)
		var back strings.Builder
		for i := 0; i < len(e); i++ {
			c := e[i]
			if c == '\\' {
				require.Less(t, i+1, len(e), "%q ends in a lone backslash", e)
				i++
				c = e[i]
				require.GreaterOrEqual(t, strings.IndexByte(`*?[]\`, c), 0, "%q escapes %q, which is literal", e, c)
			} else {
				require.Negative(t, strings.IndexByte(`*?[]`, c), "%q leaves %q unescaped", e, c)
			}
			back.WriteByte(c)
		}
		require.Equal(t, s, back.String())
	})
}
