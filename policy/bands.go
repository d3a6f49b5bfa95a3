package policy

import "fmt"

// Band is one more limit on a key, beside its primary band (the Capacity
// and rate of its Policy or Override): at most Capacity tokens, refilled at
// Refill. "10 per second, and 1,000 per day" is a primary band of capacity
// 10 at PerSecond(10) and a Band{"daily", 1000, PerDay(1000)}.
//
// Name identifies the band: to clients (the HTTP middleware lists every
// band in RateLimit-Policy and names the binding one), in Decision.Band, and
// across cutovers, where a band of the new policy takes over the balance of
// the old policy's band of the same name. It is non-empty printable ASCII
// (0x20 to 0x7E), at most MaxNameBytes long.
type Band struct {
	Name     string
	Capacity int64
	Refill   Rate
}

// MaxBands is the most bands one BandSet may hold, the primary band not
// counted: a key's limit has at most 1 + MaxBands bands.
const MaxBands = 7

// BandSet is an immutable list of bands, built once by NewBands and shared
// by reference, so a Policy that carries one stays comparable with ==. It is
// safe for concurrent use. A nil BandSet has no bands.
//
// A request is decided over all of a key's bands at once: it is allowed only
// if every band holds its cost, and then the cost is taken from every band;
// a denial takes nothing from any. Each band refills on its own, at its own
// rate, and a key is full (and may be evicted) only when every band is.
type BandSet struct {
	bands  []Band
	limits []Limit // limits[i] is bands[i]'s shape
	key    string  // the bands, written out: equal for sets built alike
}

// NewBands validates bands and builds their set. It returns nil for no
// bands, and an error wrapping ErrInvalid that names the first bad band for
// an empty, repeated or non-printable Name or one over MaxNameBytes, a
// Capacity below 1, a Refill with Tokens or Per below 1, or more than
// MaxBands bands.
func NewBands(bands ...Band) (*BandSet, error) {
	if len(bands) == 0 {
		return nil, nil
	}
	if len(bands) > MaxBands {
		return nil, fmt.Errorf("%w: %d bands, at most %d", ErrInvalid, len(bands), MaxBands)
	}
	s := &BandSet{bands: append([]Band(nil), bands...), limits: make([]Limit, len(bands))}
	for i, b := range s.bands {
		if err := validateName(b.Name); err != nil {
			return nil, fmt.Errorf("%w: band %d: %s", ErrInvalid, i, err)
		}
		if b.Name == "" {
			return nil, fmt.Errorf("%w: band %d: empty name", ErrInvalid, i)
		}
		for j := range i {
			if s.bands[j].Name == b.Name {
				return nil, fmt.Errorf("%w: band %d (%q): name is band %d's", ErrInvalid, i, b.Name, j)
			}
		}
		if b.Refill.IsZero() {
			return nil, fmt.Errorf("%w: band %d (%q): no refill rate", ErrInvalid, i, b.Name)
		}
		s.limits[i] = Limit{Capacity: b.Capacity, Refill: b.Refill}
		if err := s.limits[i].validate(); err != nil {
			return nil, fmt.Errorf("%w: band %d (%q): %s", ErrInvalid, i, b.Name, err)
		}
		// Names are printable ASCII, so a quoted name cannot contain the
		// separators.
		s.key += fmt.Sprintf("%q %d %d %d;", b.Name, b.Capacity, b.Refill.Tokens, b.Refill.Per)
	}
	return s, nil
}

// id is what tells band sets apart: equal for sets of equal bands in equal
// order, "" for none.
func (s *BandSet) id() string {
	if s == nil {
		return ""
	}
	return s.key
}

// Equal reports whether s and t hold the same bands in the same order (two
// nil or empty sets are equal). A Policy compares its BandSet by pointer;
// the limits of an OverrideSet are told apart by Equal's rule.
func (s *BandSet) Equal(t *BandSet) bool { return s.id() == t.id() }

// Len returns the number of bands; 0 for a nil set.
func (s *BandSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.bands)
}

// Bands returns a copy of the bands, in order.
func (s *BandSet) Bands() []Band {
	if s == nil {
		return nil
	}
	return append([]Band(nil), s.bands...)
}

// At returns band i, for 0 <= i < Len().
func (s *BandSet) At(i int) Band { return s.bands[i] }

// Limit returns band i's shape, for 0 <= i < Len().
func (s *BandSet) Limit(i int) Limit { return s.limits[i] }

// Index returns the position of the band named name, or -1.
func (s *BandSet) Index(name string) int {
	if s == nil || name == "" {
		return -1
	}
	for i := range s.bands {
		if s.bands[i].Name == name {
			return i
		}
	}
	return -1
}

// validateName checks a band or override name: printable ASCII, at most
// MaxNameBytes.
func validateName(name string) error {
	if len(name) > MaxNameBytes {
		return fmt.Errorf("name is %d bytes, at most %d", len(name), MaxNameBytes)
	}
	for i := range len(name) {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("name %q has byte %#x at %d, want printable ASCII", name, c, i)
		}
	}
	return nil
}
