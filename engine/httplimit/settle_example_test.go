package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// usage is what a completion reports it spent, in model tokens.
type usage struct{ prompt, completion int64 }

// complete stands for a call to a language model: about one token per 4
// characters of prompt, and at most maxTokens of completion (here 200).
func complete(prompt string, maxTokens int64) usage {
	return usage{prompt: int64(len(prompt) / 4), completion: min(maxTokens, 200)}
}

// Each tenant has a budget of 1,000 model tokens, refilled at 10 a second.
// A request is admitted on an estimate, its max_tokens, before the model
// runs; once the completion reports its usage, prompt included, the
// handler settles the actual cost: an over-estimate is given back, an
// under-estimate charged, into debt if need be, which the tenant's next
// requests repay. The Manual clock keeps the output exact; no time passes.
func ExampleSettle() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 1000, Refill: policy.PerSecond(10)},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	maxTokens := func(r *http.Request) int64 {
		n, err := strconv.ParseInt(r.URL.Query().Get("max_tokens"), 10, 64)
		if err != nil {
			return 0 // the middleware answers 500 for a cost below 1
		}
		return n
	}
	mw, err := httplimit.New(e,
		httplimit.WithKey(func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }),
		httplimit.WithCost(maxTokens))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u := complete(r.URL.Query().Get("prompt"), maxTokens(r))
		fmt.Fprintf(w, "(%d tokens of completion)\n", u.completion)
		if err := httplimit.Settle(r, u.prompt+u.completion); err != nil {
			panic(err) // a server would log it
		}
	}))

	for _, q := range []struct {
		promptChars int
		maxTokens   int64
	}{{480, 500}, {600, 200}, {2800, 300}, {40, 100}} {
		target := fmt.Sprintf("/v1/completions?max_tokens=%d&prompt=%s", q.maxTokens, strings.Repeat("a", q.promptChars))
		r := httptest.NewRequest(http.MethodPost, target, nil)
		r.Header.Set("X-Tenant", "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		d, _ := e.Peek(context.Background(), "acme")
		fmt.Printf("estimate %d: %d, Retry-After %q, %d tokens left\n", q.maxTokens, rec.Code, rec.Header().Get("Retry-After"), d.Remaining)
	}
	// Output:
	// estimate 500: 200, Retry-After "", 680 tokens left
	// estimate 200: 200, Retry-After "", 330 tokens left
	// estimate 300: 200, Retry-After "", -570 tokens left
	// estimate 100: 429, Retry-After "67", -570 tokens left
}

// Requests and model tokens limited together, as model APIs publish them
// (requests per minute beside tokens per minute): two middlewares, each
// over its own engine. The outer one counts requests at the default cost
// of 1, which Settle leaves alone; the inner one takes max_tokens, clamped
// to its capacity (a cost above it would be refused with 413 for good, and
// Settle charges what the clamp left out), and Settle settles it alone.
// Unlike WithKeys, the two are not all or nothing: a request the inner one
// refuses has spent its request in the outer one. One WithKeys cannot hold
// both: Settle settles every key of a request by the same difference, so
// its keys must be given the same cost.
func ExampleSettle_requestsAndTokens() {
	newEngine := func(p policy.Policy) *engine.Engine {
		e, err := engine.New(engine.Config{Policy: p, Clock: clock.NewManual(0)})
		if err != nil {
			panic(err)
		}
		return e
	}
	requests := newEngine(policy.Policy{Version: 1, Capacity: 3, Refill: policy.PerMinute(3)})
	defer requests.Close()
	tokens := newEngine(policy.Policy{Version: 1, Capacity: 1000, Refill: policy.PerMinute(1000)})
	defer tokens.Close()

	tenant := httplimit.WithKey(func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil })
	perRequest, err := httplimit.New(requests, tenant, httplimit.WithPolicyName("requests"))
	if err != nil {
		panic(err)
	}
	maxTokens := func(r *http.Request) int64 {
		n, err := strconv.ParseInt(r.URL.Query().Get("max_tokens"), 10, 64)
		if err != nil || n < 1 {
			return 1
		}
		return min(n, 1000) // the capacity
	}
	perToken, err := httplimit.New(tokens, tenant, httplimit.WithCost(maxTokens), httplimit.WithPolicyName("tokens"))
	if err != nil {
		panic(err)
	}
	h := perRequest.Handler(perToken.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u := complete(r.URL.Query().Get("prompt"), maxTokens(r))
		if err := httplimit.Settle(r, u.prompt+u.completion); err != nil {
			panic(err) // a server would log it
		}
	})))

	for _, maxTok := range []int64{5000, 100, 100, 100} {
		r := httptest.NewRequest(http.MethodPost, fmt.Sprintf("/v1/completions?max_tokens=%d&prompt=%s", maxTok, strings.Repeat("a", 400)), nil)
		r.Header.Set("X-Tenant", "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		reqs, _ := requests.Peek(context.Background(), "acme")
		toks, _ := tokens.Peek(context.Background(), "acme")
		fmt.Printf("max_tokens %d: %d, %d requests and %d tokens left\n", maxTok, rec.Code, reqs.Remaining, toks.Remaining)
	}
	// Output:
	// max_tokens 5000: 200, 2 requests and 700 tokens left
	// max_tokens 100: 200, 1 requests and 500 tokens left
	// max_tokens 100: 200, 0 requests and 300 tokens left
	// max_tokens 100: 429, 0 requests and 300 tokens left
}
