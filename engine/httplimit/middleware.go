package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tokenshard/tokenshard/engine"
)

// Response bodies for failures. They say what failed and nothing about the
// server's internals; the package logs nothing.
const (
	bodyKey      = "httplimit: the server could not derive a rate-limit key for this request"
	bodyKeys     = "httplimit: the server could not derive the rate-limit keys for this request"
	bodyCost     = "httplimit: the server could not derive a rate-limit cost for this request"
	bodyTooLarge = "httplimit: the request costs more than its rate limit can ever admit"
	bodyOverload = "httplimit: the rate limiter is at capacity; retry later"
	bodyClosed   = "httplimit: the rate limiter is shut down"
	bodyFailed   = "httplimit: the rate limiter failed"
	bodyDenied   = "httplimit: too many requests"
	bodyDegraded = "httplimit: the rate limiter cannot reach its store; retry later"
)

// Middleware admits HTTP requests through an engine.Admitter: the
// in-process engine.Engine, or a redisstore.Store for one quota shared by
// every replica of a service. Its configuration is fixed by New, it counts
// the requests it handles (Stats), and it is safe for concurrent use; the
// zero value is not usable. Build it with New and wrap handlers with
// Handler.
type Middleware struct {
	engine   engine.Admitter
	reclaim  reclaimer // e, if it estimates when a key slot frees up; else nil
	key      KeyFunc
	keys     KeysFunc // WithKeys; then key and cost are unused
	cost     CostFunc
	denied   DeniedFunc
	fields   Fields // the RateLimit fields' names (the default's, WithPolicyName)
	overload string // WithOverloadRetryAfter in seconds; "" when not given
	onError  ErrorFunc
	shadow   bool
	settles  bool                                  // WithCost or WithKeys: a request's cost is an estimate Settle can settle
	client   func(r *http.Request) (string, error) // the grouped client
	counts   counts
}

// Stats counts the requests a Middleware has handled since New, under
// every Handler it returned. Decided + Errors is every request.
type Stats struct {
	// Decided is the requests the engine decided, Degraded ones included.
	Decided uint64
	// Refused is the decided requests a limit denied. Under WithShadow they
	// were admitted: Refused is the requests enforcement would have
	// answered with 429.
	Refused uint64
	// Degraded is the decided requests a store's failure rule decided
	// (engine.Decision.Degraded), admitted or denied.
	Degraded uint64
	// Errors is the requests that could not be decided, each given to the
	// WithOnError function (see its list).
	Errors uint64
}

// counts holds Stats as atomic counters, each on its own cache line, since
// every request adds to one or two of them.
type counts struct {
	decided, refused, degraded, errors paddedCounter
}

type paddedCounter struct {
	atomic.Uint64
	_ [56]byte
}

// Stats returns the counts of the requests m has handled so far. Each field
// is read atomically, but not all at one instant: under load they may
// differ by the requests in flight.
func (m *Middleware) Stats() Stats {
	return Stats{
		Decided:  m.counts.decided.Load(),
		Refused:  m.counts.refused.Load(),
		Degraded: m.counts.degraded.Load(),
		Errors:   m.counts.errors.Load(),
	}
}

// reclaimer is the optional method of an Admitter that frees key slots in
// the background, as the engine's sweeps do: how long until a slot can next
// be free, and false when no background reclamation will run.
type reclaimer interface {
	ReclaimAfter() (time.Duration, bool)
}

// New returns a middleware that spends each request's cost from its key's
// bucket in e. Without options the key is the client address from
// RemoteAddr (no forwarded header is trusted), IPv6 grouped per /64, as
// ClientKey gives it; the cost is 1, and a denial is a 429. It returns an
// error wrapping ErrInvalidOption for a nil engine, a nil or invalid option,
// WithKey together with WithClientKey, or WithKeys together with any of
// WithKey, WithClientKey and WithCost.
func New(e engine.Admitter, opts ...Option) (*Middleware, error) {
	if v := reflect.ValueOf(e); e == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, fmt.Errorf("%w: nil engine", ErrInvalidOption)
	}
	c := config{policyName: DefaultPolicyName, ipv6Bits: DefaultIPv6Prefix}
	for i, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i)
		}
		if err := opt(&c); err != nil {
			return nil, err
		}
	}
	if c.key != nil && c.clientKey != nil {
		return nil, fmt.Errorf("%w: WithKey and WithClientKey both replace the key; give one", ErrInvalidOption)
	}
	if c.keys != nil && (c.key != nil || c.clientKey != nil || c.cost != nil) {
		return nil, fmt.Errorf("%w: WithKeys gives the keys and their costs; it excludes WithKey, WithClientKey and WithCost", ErrInvalidOption)
	}
	m := &Middleware{
		engine:  e,
		keys:    c.keys,
		cost:    c.cost,
		denied:  c.denied,
		fields:  Fields{policyName: c.policyName},
		onError: c.onError,
		shadow:  c.shadow,
		settles: c.cost != nil || c.keys != nil,
	}
	m.reclaim, _ = e.(reclaimer)
	if c.overload > 0 {
		m.overload = strconv.FormatInt(ceilSeconds(c.overload), 10)
	}
	header, trusted, bits := c.header, c.trusted, c.ipv6Bits
	m.client = func(r *http.Request) (string, error) {
		a, err := ClientIP(r, header, trusted)
		if err != nil {
			return "", err
		}
		return ClientKey(a, bits), nil
	}
	switch f, g := c.key, c.clientKey; {
	case f != nil:
		m.key = func(r *http.Request) (string, error) {
			key, err := f(r)
			if err != nil {
				return "", keyFuncErr(r, err)
			}
			return key, nil
		}
	case g != nil:
		m.key = func(r *http.Request) (string, error) {
			client, _ := m.client(r) // "" with ErrNoClientIP, its only error: g decides (see WithClientKey)
			key, err := g(r, client)
			if err != nil {
				return "", keyFuncErr(r, err)
			}
			return key, nil
		}
	default:
		m.key = m.client
	}
	if m.cost == nil {
		m.cost = func(*http.Request) int64 { return 1 }
	}
	if m.denied == nil {
		m.denied = func(w http.ResponseWriter, _ *http.Request, _ engine.Decision) {
			http.Error(w, bodyDenied, http.StatusTooManyRequests)
		}
	}
	if m.onError == nil {
		m.onError = func(*http.Request, error) {}
	}
	return m, nil
}

// Handler returns next behind the rate limit. Each request is decided with
// its own context before next runs; an admitted request reaches next with
// the RateLimit header fields already set on w, a denied one never does.
// The status codes are listed in the package documentation. Under
// WithShadow every request reaches next. It panics on a Middleware not
// built by New (a nil or zero one), when the handler is built rather than
// at its first request.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if m == nil || m.engine == nil {
		panic("httplimit: Handler of a Middleware not built by New")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, d, err := m.decide(r)
		if err != nil {
			m.counts.errors.Add(1)
			m.onError(r, err)
			if m.shadow {
				next.ServeHTTP(w, m.settleable(r, t, false))
				return
			}
			m.fail(w, err)
			return
		}
		m.counts.decided.Add(1)
		if d.Degraded {
			m.degraded(w, r, t, d, next)
			return
		}
		m.setRateLimit(w.Header(), t.binding, d)
		if !d.Allowed {
			m.counts.refused.Add(1)
			if !m.shadow {
				m.denied(w, r, d)
				return
			}
		}
		next.ServeHTTP(w, m.settleable(r, t, d.Allowed))
	})
}

// take is what decide asked of the engine for a request: the key whose
// decision is reported (under WithKeys the binding request's), and for
// Settle the key and cost (under WithKeys the requests).
type take struct {
	binding string
	key     string
	cost    int64
	reqs    []engine.Request
}

// decide asks the engine about r: under WithKeys one AllowAll, the key
// reported that of the binding request; else one Allow. An error is one
// the request could not be decided for, ready for fail and the WithOnError
// function.
func (m *Middleware) decide(r *http.Request) (take, engine.Decision, error) {
	if m.keys == nil {
		key, err := m.key(r)
		if err != nil {
			return take{}, engine.Decision{}, err
		}
		cost := m.cost(r)
		if cost < 1 {
			return take{}, engine.Decision{}, fmt.Errorf("%w: %d", ErrCostBelowOne, cost)
		}
		d, err := m.engine.Allow(r.Context(), key, cost)
		return take{binding: key, key: key, cost: cost}, d, err
	}
	client, _ := m.client(r) // "" with ErrNoClientIP, its only error: the function decides (see WithKeys)
	reqs, err := m.keys(r, client)
	if err != nil {
		return take{}, engine.Decision{}, keyFuncErr(r, err)
	}
	d, at, err := m.engine.AllowAll(r.Context(), reqs)
	switch {
	case errors.Is(err, engine.ErrInvalidCost) && !errors.Is(err, engine.ErrCostExceedsCapacity):
		return take{}, engine.Decision{}, fmt.Errorf("%w: %w", ErrCostBelowOne, err)
	case err != nil:
		return take{}, engine.Decision{}, err
	case at < 0 || at >= len(reqs):
		return take{}, engine.Decision{}, fmt.Errorf("%w: AllowAll named request %d of %d", ErrAdmitterContract, at, len(reqs))
	}
	return take{binding: reqs[at].Key, reqs: reqs}, d, nil
}

// degraded answers a request that a store's failure rule decided
// (engine.Decision.Degraded): no bucket was consulted, so no RateLimit
// field is set (a denial removes any an outer middleware set). An
// admission goes to next; a denial is the server's
// outage, not the client's limit, so it is given to the WithOnError
// function and answered with 503, Retry-After the decision's RetryAfter in
// whole seconds, rounded up and at least 1, and never goes to the
// WithDenied function, which answers limits. Under WithShadow the denial
// goes to next. Either way nothing was taken for Settle to settle.
func (m *Middleware) degraded(w http.ResponseWriter, r *http.Request, t take, d engine.Decision, next http.Handler) {
	m.counts.degraded.Add(1)
	if d.Allowed {
		next.ServeHTTP(w, m.settleable(r, t, false))
		return
	}
	m.onError(r, fmt.Errorf("%w; retry after %v", ErrDegraded, d.RetryAfter))
	if m.shadow {
		next.ServeHTTP(w, m.settleable(r, t, false))
		return
	}
	h := w.Header()
	clearFields(h)
	h.Set(headerRetryAfter, strconv.FormatInt(max(ceilSeconds(d.RetryAfter), 1), 10))
	http.Error(w, bodyDegraded, http.StatusServiceUnavailable)
}

// clearFields removes the RateLimit fields an outer middleware set from an
// answer that is no bucket's decision: they would describe another quota
// than the one that answered.
func clearFields(h http.Header) {
	delete(h, headerPolicy)
	delete(h, headerRateLimit)
}

// keyFuncErr wraps a key function's error in ErrKeyFunc, unless the
// request's own context has ended (a lookup canceled because the client
// went away): that request is answered as any whose context ended, not as
// the server's failure, whether or not err wraps the context's error (a
// gRPC lookup's status does not).
func keyFuncErr(r *http.Request, err error) error {
	ctxErr := r.Context().Err()
	switch {
	case ctxErr == nil:
		return fmt.Errorf("%w: %w", ErrKeyFunc, err)
	case errors.Is(err, ctxErr):
		return fmt.Errorf("httplimit: the key function: %w", err)
	}
	return fmt.Errorf("httplimit: the key function, the request's context ended (%w): %w", ctxErr, err)
}

// fail answers a request that could not be decided, for err.
//
// A 503 for a full key table carries Retry-After only when it is known:
// WithOverloadRetryAfter, else the engine's ReclaimAfter when it reclaims
// in the background. An engine that never frees a slot by itself gets none,
// since any figure would be a guess the client would act on.
func (m *Middleware) fail(w http.ResponseWriter, err error) {
	clearFields(w.Header())
	switch {
	case errors.Is(err, ErrKeyFunc) && m.keys != nil:
		http.Error(w, bodyKeys, http.StatusInternalServerError)
	case errors.Is(err, ErrKeyFunc):
		http.Error(w, bodyKey, http.StatusInternalServerError)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client has gone or the server's deadline passed: nobody reads
		// a body, but a status keeps outer handlers from logging a 200. It
		// comes before the errors below, which a key function's error
		// returned once the request's context ended may wrap too
		// (ErrNoClientIP from a WithClientKey function).
		w.WriteHeader(http.StatusServiceUnavailable)
	case errors.Is(err, engine.ErrAllowAllSize):
		http.Error(w, bodyKeys, http.StatusInternalServerError)
	case errors.Is(err, ErrNoClientIP), errors.Is(err, engine.ErrInvalidKey):
		http.Error(w, bodyKey, http.StatusInternalServerError)
	case errors.Is(err, ErrCostBelowOne):
		http.Error(w, bodyCost, http.StatusInternalServerError)
	case errors.Is(err, engine.ErrInvalidCost):
		// Only a cost above the key's capacity gets here: waiting never helps.
		http.Error(w, bodyTooLarge, http.StatusRequestEntityTooLarge)
	case errors.Is(err, engine.ErrKeyCapacity):
		if ra := m.reclaimAfter(); ra != "" {
			w.Header().Set(headerRetryAfter, ra)
		}
		http.Error(w, bodyOverload, http.StatusServiceUnavailable)
	case errors.Is(err, engine.ErrClosed):
		if m.overload != "" {
			w.Header().Set(headerRetryAfter, m.overload)
		}
		http.Error(w, bodyClosed, http.StatusServiceUnavailable)
	default:
		http.Error(w, bodyFailed, http.StatusInternalServerError)
	}
}

// reclaimAfter is the Retry-After of a 503 for a full key table, in whole
// seconds, or "" for none.
func (m *Middleware) reclaimAfter() string {
	if m.overload != "" {
		return m.overload
	}
	if m.reclaim == nil {
		return ""
	}
	d, ok := m.reclaim.ReclaimAfter()
	if !ok {
		return ""
	}
	return strconv.FormatInt(max(ceilSeconds(d), 1), 10) // never "retry now"
}
