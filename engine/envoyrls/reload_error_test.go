package envoyrls_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/policy"
)

// madeButFailed is an engine whose next ReplacePolicy installs the policy
// and then fails, as a Redis store's does when Redis fails after the
// cutover was recorded.
type madeButFailed struct {
	*engine.Engine
	fail bool
}

var errAfterCutover = errors.New("redis failed after the cutover was recorded")

func (e *madeButFailed) ReplacePolicy(ctx context.Context, p policy.Policy, v int64) error {
	err := e.Engine.ReplacePolicy(ctx, p, v)
	if err == nil && e.fail {
		e.fail = false
		return errAfterCutover
	}
	return err
}

// A Reload whose cutover was made though ReplacePolicy failed leaves the
// server on its old configurations and the admitter on the new policy; a
// Reload of the same configurations then completes without another
// cutover.
func TestReloadAfterAMadeCutoverFailed(t *testing.T) {
	const y = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	cfgs := rlstest.Parse(t, y)
	p, err := envoyrls.Policy(1, cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	a := &madeButFailed{Engine: e, fail: true}
	srv, err := envoyrls.NewServer(a, cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	raised := rlstest.Parse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 9}\n")
	if err := srv.Reload(context.Background(), raised...); !errors.Is(err, errAfterCutover) {
		t.Fatalf("Reload: %v, want the cutover's error", err)
	}
	resp, err := srv.ShouldRateLimit(context.Background(), rlstest.Req("d", 0, rlstest.D("k=x")))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); got != 5 || a.Policy().Version != 2 {
		t.Errorf("after the failed Reload: answered with a limit of %d under version %d, want the old configuration's 5 under the new policy, version 2", got, a.Policy().Version)
	}
	if err := srv.Reload(context.Background(), raised...); err != nil {
		t.Fatalf("Reload again: %v", err)
	}
	if v := a.Policy().Version; v != 2 {
		t.Errorf("version %d after the second Reload, want 2: no second cutover", v)
	}
	resp, err = srv.ShouldRateLimit(context.Background(), rlstest.Req("d", 0, rlstest.D("k=x")))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); got != 9 {
		t.Errorf("after the second Reload: a limit of %d, want 9", got)
	}
	if err := srv.CheckPolicy(); err != nil {
		t.Errorf("CheckPolicy: %v", err)
	}
}
