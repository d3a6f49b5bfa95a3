package storestats

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenshard/tokenshard/engine/promstats"
	"github.com/tokenshard/tokenshard/engine/promstats/internal/vocab"
	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// Collector is a prometheus.Collector of one redisstore.Store's Stats.
// Create it with New: the zero Collector has no descriptors and is not
// usable.
type Collector struct {
	s *redisstore.Store
	// shared with promstats (see the package doc)
	decisions, peeks, refunds, errs, allCalls, allErrs *prometheus.Desc
	// the store's own
	scripted, retries *prometheus.Desc
	// its leases' (redisstore.Config.Leases)
	local, leased, returned, forfeited *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector of s's Stats. It returns an error wrapping
// promstats.ErrInvalidOption for a nil s.
func New(s *redisstore.Store) (*Collector, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil store", promstats.ErrInvalidOption)
	}
	own := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(vocab.Namespace, "store", name), help, nil, nil)
	}
	return &Collector{
		s:         s,
		decisions: vocab.Decisions.Desc(),
		peeks:     vocab.Peeks.Desc(),
		refunds:   vocab.Refunds.Desc(),
		errs:      vocab.Errors.Desc(),
		allCalls:  vocab.AllowAllCalls.Desc(),
		allErrs:   vocab.AllowAllErrors.Desc(),
		scripted:  own("decisions_total", "Requests the Redis script decided, those it answered with an error included."),
		retries:   own("retries_total", "Script calls sent again: a newer policy or a cutover under way, a bucket's history, a script Redis lacked, an FCALL refused for memory, a slot being migrated."),
		local:     own("local_decisions_total", "Requests a lease decided in the process, without Redis (counted in tokenshard_decisions_total too, not in store_decisions_total)."),
		leased:    own("leased_tokens_total", "Tokens Redis granted as leases."),
		returned:  own("returned_tokens_total", "Leased tokens given back to Redis unspent."),
		forfeited: own("forfeited_tokens_total", "Leased tokens given up unspent: taken across a cutover that could have clamped them, or not taken back by Redis."),
	}, nil
}

// Describe sends the descriptors of the twelve families Collect sends.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.decisions
	ch <- c.peeks
	ch <- c.refunds
	ch <- c.errs
	ch <- c.allCalls
	ch <- c.allErrs
	ch <- c.scripted
	ch <- c.retries
	ch <- c.local
	ch <- c.leased
	ch <- c.returned
	ch <- c.forfeited
}

// Collect sends one reading of the store's Stats. It reads atomics only and
// never talks to Redis (see the package doc).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	vocab.Counter(ch, c.decisions, st.Allowed, vocab.Allowed)
	vocab.Counter(ch, c.decisions, st.Denied, vocab.Denied)
	vocab.Counter(ch, c.decisions, st.DegradedAllowed, vocab.DegradedAllowed)
	vocab.Counter(ch, c.decisions, st.DegradedDenied, vocab.DegradedDenied)
	vocab.Counter(ch, c.peeks, st.Peeks)
	vocab.Counter(ch, c.refunds, st.Refunds)
	vocab.CollectErrors(ch, c.errs, st.Errors)
	vocab.Counter(ch, c.allCalls, st.AllowAll.Admitted, vocab.Admitted)
	vocab.Counter(ch, c.allCalls, st.AllowAll.Refused, vocab.Refused)
	vocab.CollectErrors(ch, c.allErrs, st.AllowAll.Errors)
	vocab.Counter(ch, c.scripted, st.Decisions)
	vocab.Counter(ch, c.retries, st.Retries)
	vocab.Counter(ch, c.local, st.Local)
	vocab.Counter(ch, c.leased, st.LeasedTokens)
	vocab.Counter(ch, c.returned, st.ReturnedTokens)
	vocab.Counter(ch, c.forfeited, st.ForfeitedTokens)
}
