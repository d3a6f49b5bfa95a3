package promstats

import "errors"

// ErrInvalidOption is returned by New for a nil engine or a nil Option; the
// wrapping error says which. Test for it with errors.Is.
var ErrInvalidOption = errors.New("promstats: invalid option")
