package envoyrls

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// Bucket keys. A limited descriptor's bucket key is
//
//	tag rule "|" values
//
// tag is "{" + escape(domain) + "}", or "{#" + a hash of the domain + "}"
// when that is longer than maxTagBytes. rule names the configuration
// entry the descriptor matched: for each entry on its path from the domain,
// "/" + escape(key) and then "=" + escape(value) for an exact value, "~" for
// an entry with no value, "!" + escape(value) for a wildcard value with
// share_threshold and "?" + escape(value) for one without; "#" + a hash of
// that path when tag and path are longer than maxRule. values are the
// request's values at the entries whose value varies (no value, or a wildcard
// without share_threshold), escaped and joined by "|"; or "#" + a hash of
// them when the whole key would be longer than MaxKeyBytes.
//
// escape keeps ASCII letters, digits, '-', '.' and '_' and writes every other
// byte as '%' and two hex digits, so none of the bytes the layout uses
// ("{}/=~!?|#*%") appears in an escaped string. Hence no two entries of
// one configuration, or of two domains, share a rule; "|" ends the rule,
// so the override pattern rule + "|*" matches the keys of that rule alone;
// and no key holds a '*', so an exact override matches it literally.
// A hash is the first 32 hex digits (128 bits) of a SHA-256.
const (
	// MaxKeyBytes is the longest bucket key the server sends: the admitter
	// must accept keys of this length (engine.DefaultMaxKeyBytes; the
	// engine's and the Redis store's default bound).
	MaxKeyBytes = 256
	maxTagBytes = 64
	maxRule     = 160
)

func escape(s string) string {
	const hexd = "0123456789ABCDEF"
	n := 0
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexd[c>>4])
		b.WriteByte(hexd[c&15])
	}
	return b.String()
}

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_'
}

func hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		// Length-prefixed, so that the parts' boundaries count.
		h.Write(strconv.AppendInt(nil, int64(len(p)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

func domainTag(domain string) string {
	t := "{" + escape(domain) + "}"
	if len(t) > maxTagBytes {
		t = "{#" + hash(domain) + "}"
	}
	return t
}

func ruleKey(tag, path string) string {
	if len(tag)+len(path) > maxRule {
		return tag + "#" + hash(path)
	}
	return tag + path
}

// bucketKey is rule's key for the request values vals (those at the
// variable entries of its path, in order).
func bucketKey(rule string, vals []string) string {
	n := len(rule) + 1
	for i, v := range vals {
		if i > 0 {
			n++
		}
		n += len(v)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(rule)
	b.WriteByte('|')
	for i, v := range vals {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(escape(v))
	}
	if b.Len() > MaxKeyBytes {
		return rule + "|#" + hash(vals...)
	}
	return b.String()
}
