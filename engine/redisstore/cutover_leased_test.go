package redisstore_test

import (
	"testing"
)

// TestCutoversLeased runs the store's cutover tests on stores with leases
// on: a lease taken before a cutover tops nobody up, and every cutover
// keeps its contract. The whole package runs so with
// TOKENSHARD_TEST_LEASES=1, less the tests of exact balances, raw buckets
// and counters that leases change by design.
func TestCutoversLeased(t *testing.T) {
	defer func(was bool) { leaseMode = was }(leaseMode)
	leaseMode = true
	for name, f := range map[string]func(*testing.T){
		"ClusterCommittedUnpublishedThenReplace": TestClusterCommittedUnpublishedThenReplace,
		"ClusterLatePublishAtCommitInstant":      TestClusterLatePublishAtCommitInstant,
		"ClusterLengtheningFinishedByAnother":    TestClusterLengtheningFinishedByAnother,
		"ClusterGlobalLostNotReinstalledOlder":   TestClusterGlobalLostNotReinstalledOlder,
		"ClusterCutoverLinearizable":             TestClusterCutoverLinearizable,
		"ClusterInterruptedCutover":              TestClusterInterruptedCutover,
		"FillsNoSlowerCoversDebts":               TestFillsNoSlowerCoversDebts,
		"RacingLengtheningCutovers":              TestRacingLengtheningCutovers,
		"ManyBucketsBehindOverrides":             TestManyBucketsBehindOverrides,
		"ChainManyKeysDenied":                    TestChainManyKeysDenied,
		"ChainEvictFull":                         TestChainEvictFull,
		"PublishThenContextEnds":                 TestPublishThenContextEnds,
		"LostHistoryRestartsEmpty":               TestLostHistoryRestartsEmpty,
		"TrimWithChains":                         TestTrimWithChains,
		"PendingFlagNeedsTheLock":                TestPendingFlagNeedsTheLock,
		"ExpiryAcrossCutovers":                   TestExpiryAcrossCutovers,
		"SmallLengtheningSetsExpiries":           TestSmallLengtheningSetsExpiries,
		"PendingCutoverWritesNoExpiry":           TestPendingCutoverWritesNoExpiry,
		"SmokeFirstExample":                      TestSmokeFirstExample,
	} {
		t.Run(name, f)
	}
}
