package httplimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// A parser of RFC 9651 structured-field Lists, enough to check the fields
// as a client's parser reads them: Items and Inner Lists with Parameters;
// bare Integers, Decimals, Strings, Tokens and Booleans (Byte Sequences,
// Dates and Display Strings are refused, since the fields never carry them).
// It follows the parsing algorithms of section 4.2, refusing what they
// refuse.

// sfToken is a Token bare item, apart from a String of the same text.
type sfToken string

// sfParam is one parameter: a key and its bare item (true when no value).
type sfParam struct {
	key   string
	value any
}

// sfMember is a List member: an Item (value a bare item) or an Inner List
// (value a []sfMember of Items), and its parameters in order.
type sfMember struct {
	value  any
	params []sfParam
}

// param returns the value of the parameter named key.
func (m sfMember) param(key string) (any, bool) {
	for _, p := range m.params {
		if p.key == key {
			return p.value, true
		}
	}
	return nil, false
}

var errSF = errors.New("structured field does not parse")

type sfParser struct {
	s string
	i int
}

// parseSFList parses the field lines of a List field as section 4.2 says:
// joined with ", ", then the List.
func parseSFList(lines []string) ([]sfMember, error) {
	p := &sfParser{s: strings.Join(lines, ", ")}
	p.skipSP()
	var list []sfMember
	for p.i < len(p.s) {
		m, err := p.member()
		if err != nil {
			return nil, err
		}
		list = append(list, m)
		p.skipOWS()
		if p.i == len(p.s) {
			return list, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("%w: %q at %d, want ','", errSF, p.s[p.i], p.i)
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return nil, fmt.Errorf("%w: trailing comma", errSF)
		}
	}
	return list, nil
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) member() (sfMember, error) {
	if p.i < len(p.s) && p.s[p.i] == '(' {
		return p.innerList()
	}
	return p.item()
}

func (p *sfParser) innerList() (sfMember, error) {
	p.i++ // '('
	var items []sfMember
	for p.i < len(p.s) {
		p.skipSP()
		if p.i < len(p.s) && p.s[p.i] == ')' {
			p.i++
			params, err := p.params()
			return sfMember{items, params}, err
		}
		it, err := p.item()
		if err != nil {
			return sfMember{}, err
		}
		items = append(items, it)
		if p.i < len(p.s) && p.s[p.i] != ' ' && p.s[p.i] != ')' {
			return sfMember{}, fmt.Errorf("%w: inner list item not followed by SP or ')'", errSF)
		}
	}
	return sfMember{}, fmt.Errorf("%w: unterminated inner list", errSF)
}

func (p *sfParser) item() (sfMember, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfMember{}, err
	}
	params, err := p.params()
	return sfMember{v, params}, err
}

func (p *sfParser) params() ([]sfParam, error) {
	var params []sfParam
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var v any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		// A key seen again overwrites its value in place (section 4.2.3.2).
		replaced := false
		for j := range params {
			if params[j].key == key {
				params[j].value, replaced = v, true
			}
		}
		if !replaced {
			params = append(params, sfParam{key, v})
		}
	}
	return params, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.i == len(p.s) || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", fmt.Errorf("%w: key at %d", errSF, p.i)
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || ('A' <= c && c <= 'Z') }

func (p *sfParser) bareItem() (any, error) {
	if p.i == len(p.s) {
		return nil, fmt.Errorf("%w: empty bare item", errSF)
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.string()
	case c == '*' || isAlpha(c):
		return p.token(), nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, fmt.Errorf("%w: boolean", errSF)
	default:
		return nil, fmt.Errorf("%w: unsupported bare item %q", errSF, c)
	}
}

// number parses an Integer (int64) or a Decimal (float64), section 4.2.4.
func (p *sfParser) number() (any, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	if p.i == len(p.s) || !isDigit(p.s[p.i]) {
		return nil, fmt.Errorf("%w: number without digits", errSF)
	}
	digits, dot := 0, -1
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case isDigit(c):
			digits++
		case c == '.' && dot < 0:
			if digits > 12 {
				return nil, fmt.Errorf("%w: decimal integer part too long", errSF)
			}
			dot = p.i
		default:
			goto done
		}
		p.i++
		if dot < 0 && digits > 15 || dot >= 0 && digits > 15 {
			return nil, fmt.Errorf("%w: number too long", errSF)
		}
	}
done:
	text := p.s[start:p.i]
	if dot < 0 {
		return strconv.ParseInt(text, 10, 64)
	}
	if frac := p.i - dot - 1; frac < 1 || frac > 3 {
		return nil, fmt.Errorf("%w: decimal fraction of %d digits", errSF, frac)
	}
	return strconv.ParseFloat(text, 64)
}

func (p *sfParser) string() (string, error) {
	p.i++ // '"'
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i == len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", fmt.Errorf("%w: bad escape", errSF)
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: string byte %#x", errSF, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: unterminated string", errSF)
}

func (p *sfParser) token() sfToken {
	start := p.i
	p.i++
	for p.i < len(p.s) && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
		p.i++
	}
	return sfToken(p.s[start:p.i])
}

func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// The parser itself, on the RFC's own cases and the fields' shapes.
func TestSFParser(t *testing.T) {
	got, err := parseSFList([]string{`"default";q=10;w=5, "daily";q=20;w=86400`})
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, sfMember{"default", []sfParam{{"q", int64(10)}, {"w", int64(5)}}}, got[0])
	assert.Equal(t, "daily", got[1].value)

	got, err = parseSFList([]string{`sugar, tea;x=?1`, `(rum "x");lvl=1.5`})
	require.NoError(t, err)
	require.Len(t, got, 3)
	assert.Equal(t, sfToken("sugar"), got[0].value)
	assert.Equal(t, []sfParam{{"x", true}}, got[1].params)
	assert.Equal(t, []sfMember{{sfToken("rum"), nil}, {"x", nil}}, got[2].value)
	assert.Equal(t, []sfParam{{"lvl", 1.5}}, got[2].params)

	got, err = parseSFList([]string{`"a\"b\\c";k;k=2`})
	require.NoError(t, err)
	assert.Equal(t, sfMember{`a"b\c`, []sfParam{{"k", int64(2)}}}, got[0])

	for _, bad := range []string{
		`"a",`, `"a";Q=1`, `"a";q=1000000000000000`, `"unterminated`, `"a" "b"`,
		`"a\x"`, `"a";q=1.`, `"a";q=-`, "\"tab\tin\"", `:Ynl0ZXM=:`, `(1 2`,
	} {
		_, err := parseSFList([]string{bad})
		assert.ErrorIs(t, err, errSF, bad)
	}
}

// checkDraftFields checks one response's fields against
// draft-ietf-httpapi-ratelimit-headers-11: RateLimit-Policy a List of
// Items, each a String naming a quota policy, unique in the List, with an
// Integer q (required, the quota) and w (the window in seconds);
// RateLimit a List of Items, each a String naming a policy of
// RateLimit-Policy, with an Integer r (required, the remaining quota, at
// most that policy's q) and t (the seconds until the quota resets). The
// draft lets other parameters through as comments; this package sends only
// those it defines. On a 429 Retry-After is t of the first item. It returns
// the RateLimit items by name, r and t.
func checkDraftFields(t *testing.T, h http.Header, status int) map[string][2]int64 {
	t.Helper()
	pol, err := parseSFList(h.Values("RateLimit-Policy"))
	require.NoError(t, err, "RateLimit-Policy %q", h.Values("RateLimit-Policy"))
	lim, err := parseSFList(h.Values("RateLimit"))
	require.NoError(t, err, "RateLimit %q", h.Values("RateLimit"))
	require.NotEmpty(t, pol, "a RateLimit-Policy item")
	require.NotEmpty(t, lim, "a RateLimit item")

	quota := map[string]int64{}
	for _, m := range pol {
		name, ok := m.value.(string)
		require.True(t, ok, "a policy item is a String: %#v", m.value)
		_, dup := quota[name]
		require.False(t, dup, "policy %q listed twice", name)
		q, ok := m.param("q")
		require.True(t, ok, "policy %q has q", name)
		require.IsType(t, int64(0), q, "policy %q: q", name)
		require.GreaterOrEqual(t, q.(int64), int64(0))
		quota[name] = q.(int64)
		if w, ok := m.param("w"); ok {
			require.IsType(t, int64(0), w, "policy %q: w", name)
			require.GreaterOrEqual(t, w.(int64), int64(1))
		}
		for _, p := range m.params {
			require.Contains(t, []string{"q", "w", "qu", "pk"}, p.key, "a parameter of -11's RateLimit-Policy")
		}
	}
	got := map[string][2]int64{}
	for i, m := range lim {
		name, ok := m.value.(string)
		require.True(t, ok, "a limit item is a String: %#v", m.value)
		q, ok := quota[name]
		require.True(t, ok, "limit %q names a policy of RateLimit-Policy", name)
		r, ok := m.param("r")
		require.True(t, ok, "limit %q has r", name)
		require.IsType(t, int64(0), r)
		require.GreaterOrEqual(t, r.(int64), int64(0))
		require.LessOrEqual(t, r.(int64), q, "limit %q: r within q", name)
		tt, ok := m.param("t")
		require.True(t, ok, "limit %q has t", name)
		require.IsType(t, int64(0), tt)
		require.GreaterOrEqual(t, tt.(int64), int64(0))
		for _, p := range m.params {
			require.Contains(t, []string{"r", "t", "pk"}, p.key, "a parameter of -11's RateLimit")
		}
		got[name] = [2]int64{r.(int64), tt.(int64)}
		if i == 0 && status == http.StatusTooManyRequests {
			assert.Equal(t, []string{strconv.FormatInt(tt.(int64), 10)}, h.Values("Retry-After"), "Retry-After is t")
			assert.Zero(t, r, "a denial leaves r=0")
		}
	}
	return got
}

// Every response of a run through a real server, over a policy with
// bands and named and unnamed overrides, admitted and denied, carries
// fields that parse as -11 says; so do the fields of a shadow middleware
// inside an enforcing one.
func TestHeaderFieldsParse(t *testing.T) {
	bands, err := policy.NewBands(policy.Band{Name: "minute", Capacity: 4, Refill: policy.Rate{Tokens: 4, Per: time.Minute}})
	require.NoError(t, err)
	ov, err := policy.NewOverrideSet(
		policy.Override{Match: "192.0.2.2", Capacity: 7, TokensPerSecond: 2},
		policy.Override{Match: "192.0.2.3", Capacity: 2, TokensPerSecond: 1, Name: "small \"quoted\" \\name"},
	)
	require.NoError(t, err)
	e, clk := newEngine(t, engine.Config{Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1, Bands: bands, Overrides: ov}})
	cand, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	shadow, err := httplimit.New(cand, httplimit.WithShadow(), httplimit.WithPolicyName("candidate"))
	require.NoError(t, err)
	srv := serve(t, e, shadow.Handler(ok),
		httplimit.WithTrustedProxies(httplimit.XForwardedFor, mustPrefix("127.0.0.0/8"), mustPrefix("::1/128")))

	statuses := map[int]int{}
	for i := range 40 {
		client := fmt.Sprintf("192.0.2.%d", 1+i%3)
		res := get(t, srv, "X-Forwarded-For", client)
		statuses[res.status]++
		got := checkDraftFields(t, res.header, res.status)
		if res.status == http.StatusOK {
			assert.Contains(t, got, "candidate", "the shadow item beside the enforced one")
			assert.Len(t, got, 2)
		} else {
			assert.NotContains(t, got, "candidate", "a refused request never reaches the shadow middleware")
		}
		if i%7 == 6 {
			clk.Advance(time.Second)
		}
	}
	assert.Positive(t, statuses[http.StatusOK])
	assert.Positive(t, statuses[http.StatusTooManyRequests])
	assert.Equal(t, 40, statuses[http.StatusOK]+statuses[http.StatusTooManyRequests])
}
