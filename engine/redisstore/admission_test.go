package redisstore_test

import (
	"testing"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/admissiontest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// TestAdmission runs the behaviour suite every Admitter passes, the one the
// engine passes, on the store through a real Redis, its time driven by the
// suite's clock through the scripts (Config.Clock). Under the race
// detector only its Concurrent behaviours run (admissiontest.Concurrent).
func TestAdmission(t *testing.T) {
	exactBalances(t)
	admissiontest.Run(t, func(t *testing.T, s admissiontest.Setup) engine.Admitter {
		if !admissiontest.Concurrent(t) {
			skipUnderRace(t)
		}
		return newStore(t, redisstore.Config{Policy: s.Policy}, s.Clock)
	})
}

// TestAdmissionLeased runs the behaviour suite on a store with leases, with
// the differences its documentation states (admissiontest.Options.Leased);
// under the race detector, only its Concurrent behaviours.
func TestAdmissionLeased(t *testing.T) {
	admissiontest.RunWith(t, func(t *testing.T, s admissiontest.Setup) engine.Admitter {
		if !admissiontest.Concurrent(t) {
			skipUnderRace(t)
		}
		return newStore(t, redisstore.Config{Policy: s.Policy, Leases: &redisstore.Leases{}}, s.Clock)
	}, admissiontest.Options{Leased: true})
}
