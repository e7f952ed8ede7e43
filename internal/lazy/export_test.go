package lazy

// MaxLayerStats is maxLayerStats, for tests.
const MaxLayerStats = maxLayerStats
