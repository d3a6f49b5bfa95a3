package engine

// MailboxSize is how many single requests, and separately batch parts, may
// wait for one shard, for tests that fill a mailbox.
const MailboxSize = mailboxSize

// NewBare returns an engine whose shards answer every single request with a
// zero Decision, deciding nothing: the transport alone, for benchmarks.
func NewBare(cfg Config) (*Engine, error) { return newEngine(cfg, true) }

// ShardOf returns the index of the shard that owns key.
func (e *Engine) ShardOf(key string) int {
	j, _ := e.shardOf(key)
	return j
}

// SetSnapshotFileHook sets the hook e's SnapshotFile calls with "wait"
// before it waits for an earlier call and "rename" before its rename. Set
// it before any SnapshotFile of e.
func SetSnapshotFileHook(e *Engine, f func(stage string)) { e.snapshotFileHook = f }

// SetPressureHook sets the hook each pressure sweep of e calls once it has
// decided when the next may start, before it records that time. Set it
// before the first pressure sweep of e.
func SetPressureHook(e *Engine, f func()) { e.pressureHook = f }

// Closing returns the channel e's Close closes as it begins.
func Closing(e *Engine) <-chan struct{} { return e.closing }
