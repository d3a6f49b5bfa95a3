package redisstore_test

import (
	"testing"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/admissiontest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// TestAdmissionLeased runs the behaviour suite on a store with leases, with
// the differences its documentation states (admissiontest.Options.Leased).
func TestAdmissionLeased(t *testing.T) {
	admissiontest.RunWith(t, func(t *testing.T, s admissiontest.Setup) engine.Admitter {
		return newStore(t, redisstore.Config{Policy: s.Policy, Leases: &redisstore.Leases{}}, s.Clock)
	}, admissiontest.Options{Leased: true})
}
