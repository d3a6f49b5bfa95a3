package redisstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tokenshard/tokenshard/policy"
)

// wirePolicy is a policy as Redis stores it, readable with redis-cli. A
// policy written before rates and bands existed decodes unchanged: the new
// fields are omitted when unset.
type wirePolicy struct {
	Version         int64
	Capacity        int64
	TokensPerSecond int64
	Refill          policy.Rate    `json:",omitzero"`
	Bands           []policy.Band  `json:",omitempty"`
	Overrides       []wireOverride `json:",omitempty"`
}

// wireOverride is an Override with its bands, which policy.Override leaves
// out of its JSON (a BandSet is built by NewBands). A Match that is not
// valid UTF-8 also travels as MatchBytes (base64), the exact bytes: JSON
// strings are UTF-8, and encoding/json writes such a Match with each invalid
// byte replaced by U+FFFD, so it would come back matching other keys. Match
// keeps that replaced form, which is what a store that predates MatchBytes
// has always read.
type wireOverride struct {
	policy.Override
	MatchBytes []byte        `json:",omitempty"`
	Bands      []policy.Band `json:",omitempty"`
}

// encodePolicy is p as Redis stores it.
func encodePolicy(p policy.Policy) string {
	w := wirePolicy{Version: p.Version, Capacity: p.Capacity, TokensPerSecond: p.TokensPerSecond,
		Refill: p.Refill, Bands: p.Bands.Bands()}
	for _, o := range p.Overrides.Overrides() {
		wo := wireOverride{Override: o, Bands: o.Bands.Bands()}
		if !utf8.ValidString(o.Match) {
			wo.MatchBytes = []byte(o.Match)
		}
		w.Overrides = append(w.Overrides, wo)
	}
	b, _ := json.Marshal(w) // integers, strings and bytes only: it cannot fail
	return string(b)
}

// decodePolicy reads a policy as Redis stores it. A field it does not
// know is an error: a newer version of the package wrote it, and read
// without it the policy would not limit what it says.
func decodePolicy(blob string) (policy.Policy, error) {
	var w wirePolicy
	dec := json.NewDecoder(strings.NewReader(blob))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return policy.Policy{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return policy.Policy{}, fmt.Errorf("decoding %q: more than one value", blob)
	}
	bands, err := policy.NewBands(w.Bands...)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("decoding %q: %w", blob, err)
	}
	os := make([]policy.Override, len(w.Overrides))
	for i, o := range w.Overrides {
		os[i] = o.Override
		if o.MatchBytes != nil {
			os[i].Match = string(o.MatchBytes)
		}
		if os[i].Bands, err = policy.NewBands(o.Bands...); err != nil {
			return policy.Policy{}, fmt.Errorf("decoding %q: override %d: %w", blob, i, err)
		}
	}
	set, err := policy.NewOverrideSet(os...)
	if err != nil {
		return policy.Policy{}, err
	}
	p := policy.Policy{Version: w.Version, Capacity: w.Capacity, TokensPerSecond: w.TokensPerSecond,
		Refill: w.Refill, Bands: bands, Overrides: set}
	if err := p.Validate(); err != nil {
		return policy.Policy{}, fmt.Errorf("decoding %q: %w", blob, err)
	}
	return p, nil
}

// A shape (a key's whole limit, policy.Shape) travels to the decide script
// as three strings, in the script's terms (see decide.lua's header), the
// last two joined by a space when there are bands:
//
//   - cap: the primary band's capacity, in decimal;
//   - rate: the primary band's rate, "N" for N tokens per second (the only
//     form before rates of any period existed, so a plain key's bucket and
//     history entries keep their old bytes), else "N/P" for N tokens per P
//     ns;
//   - bands: "" for none, else one "name:cap:rate" per band of the shape's
//     BandSet, in order, joined by ",", the name in hex (band names may hold
//     any printable ASCII, separators included).
//
// Band names matter to the script only at a cutover, where a band takes
// over the balance of the old shape's band of the same name; it compares
// their hex forms.
type shapeArgs struct {
	rate  string
	bands string
}

// encodeShape returns sh's script arguments.
func encodeShape(sh policy.Shape) shapeArgs {
	bands := make([]string, sh.Bands.Len())
	for i := range bands {
		band := sh.Bands.At(i)
		bands[i] = fmt.Sprintf("%x:%d:%s", band.Name, band.Capacity, rateArg(band.Refill))
	}
	return shapeArgs{rate: rateArg(sh.Primary.Rate()), bands: strings.Join(bands, ",")}
}

// arg is the rate and bands as one argument of the decide script: the rate
// alone, or the rate, a space and the bands.
func (a shapeArgs) arg() string {
	if a.bands == "" {
		return a.rate
	}
	return a.rate + " " + a.bands
}

// rateArg is a rate as the script reads it: "N" per second, else "N/P".
func rateArg(r policy.Rate) string {
	if r.Per == time.Second {
		return strconv.FormatInt(r.Tokens, 10)
	}
	return strconv.FormatInt(r.Tokens, 10) + "/" + strconv.FormatInt(int64(r.Per), 10)
}

// minCapacity is the smallest capacity of sh's bands: a cost above it can
// never be admitted.
func minCapacity(sh policy.Shape) int64 {
	c := sh.Primary.Capacity
	for i := range sh.Bands.Len() {
		c = min(c, sh.Bands.At(i).Capacity)
	}
	return c
}

// period returns band l's units per token, P ns.
func period(l policy.Limit) uint64 { return uint64(l.Rate().Per) }

// parseAhead reads the script's time until a bucket's last update: a
// positive decimal of ns, saturated at math.MaxInt64 (a server clock
// centuries behind).
func parseAhead(ns string) (int64, error) {
	n, err := strconv.ParseUint(ns, 10, 63)
	// ParseUint stops at the first digit past the range: the rest must be
	// digits too.
	if errors.Is(err, strconv.ErrRange) && strings.Trim(ns, "0123456789") == "" {
		n, err = math.MaxInt64, nil
	}
	if err != nil || n == 0 {
		return 0, fmt.Errorf("malformed time ahead %q", ns)
	}
	return int64(n), nil
}

// parseSigned reads one band's balance in units as the script writes it, a
// decimal of magnitude below capacity*P <= 2^126 that carries a "-" in
// debt, as a level of period per: floor(units / per) whole tokens and the
// remainder, 0 <= Frac < per.
func parseSigned(units string, per uint64) (policy.Level, error) {
	mag, neg := units, len(units) > 1 && units[0] == '-'
	if neg {
		mag = units[1:]
	}
	var hi, lo uint64
	for i := range len(mag) {
		d := mag[i] - '0'
		if d > 9 {
			return policy.Level{}, fmt.Errorf("malformed balance %q", mag)
		}
		h1, l1 := bits.Mul64(lo, 10)
		h2, l2 := bits.Mul64(hi, 10)
		var c uint64
		lo, c = bits.Add64(l1, uint64(d), 0)
		hi, c = bits.Add64(h1, l2, c)
		if h2 != 0 || c != 0 {
			return policy.Level{}, fmt.Errorf("balance %q overflows", mag)
		}
	}
	if mag == "" || hi >= per {
		return policy.Level{}, fmt.Errorf("malformed balance %q", mag)
	}
	q, r := bits.Div64(hi, lo, per)
	switch {
	case q > math.MaxInt64:
		return policy.Level{}, fmt.Errorf("balance %q overflows", mag)
	case !neg:
		return policy.Level{Tokens: int64(q), Frac: r}, nil
	case r == 0:
		return policy.Level{Tokens: -int64(q)}, nil
	case q == math.MaxInt64:
		return policy.Level{}, fmt.Errorf("balance %q overflows", units)
	}
	return policy.Level{Tokens: -int64(q) - 1, Frac: per - r}, nil
}
