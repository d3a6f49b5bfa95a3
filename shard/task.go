package shard

import "github.com/tokenshard/tokenshard/msg"

// A task is background work that the loop runs a slice at a time between
// messages (see Shard.turn): a sweep, a conversion pass, a snapshot. Each
// is a walk over the State's table in hash order, which stays right while
// keys come and go between slices. At most one runs at a time. To add a
// kind: implement task over State methods that tests call directly, and
// start it from the message (or State change) that asks for it.
type task interface {
	// step does one slice of the work and reports whether the task is over
	// (having answered whoever asked for it).
	step(s *Shard) (done bool)
	// stop ends the task unfinished, as the shard stops.
	stop(s *Shard)
}

// sweepTask is a sweep (EvictFull, or a background sweep): each slice judges
// its buckets at a fresh clock reading, and the end answers the sweep. A
// caller that stops waiting (Sweep.Stop) ends the judging before the next
// slice: the rest of the walk only clears the marks of keys born during the
// sweep, a slice at a time, so a context bounds the pass to the slice in
// progress and a walk that judges nothing.
type sweepTask struct {
	w       *msg.Sweep
	stopped bool
}

func (t *sweepTask) step(s *Shard) bool {
	if !t.stopped {
		select {
		case <-t.w.Stop: // nil for a caller that never stops: never ready
			t.stopped = true
		default:
		}
	}
	if t.stopped {
		done := s.state.unmarkSlice(SliceSize)
		if done {
			t.end(s, msg.ErrSweepStopped)
		}
		return done
	}
	done, err := s.state.sweepSlice(s.clk.Now(), SliceSize)
	if done {
		t.end(s, err)
	}
	return done
}

// stop answers the sweep with what it evicted so far and ErrClosed.
func (t *sweepTask) stop(s *Shard) { t.end(s, msg.ErrClosed) }

// end ends the sweep, counts it, and answers it. The coordinator holds the
// reply, so no other control message arrives until it is sent.
func (t *sweepTask) end(s *Shard, err error) {
	r := s.state.endSweep(err)
	s.stats.add(msg.Sweeps, 1)
	s.stats.add(msg.Evicted, uint64(r.Evicted))
	s.publish()
	t.w.Done <- r
}

// convertTask is the conversion pass the State starts when it keeps many
// policy generations, or at a cutover into a policy with patterns: it
// brings untouched buckets to the policy in force, reading no clock and
// changing no answer, so the history can be dropped.
type convertTask struct{}

func (convertTask) step(s *Shard) bool { return s.state.convertSlice(SliceSize) }

// stop leaves the pass to endTask's abandon: no one waits for it.
func (convertTask) stop(*Shard) {}

// snapTask copies the table into the snapshot's chunks, one chunk a slice,
// whenever the writer has one free; with none free it waits (see inputs).
// A slow writer only delays the copy.
type snapTask struct {
	m       *msg.Snapshot
	waiting bool // no chunk was free at the last step
	over    bool // the walk ended, or the writer gave up
}

func (t *snapTask) step(s *Shard) bool {
	select {
	case c := <-t.m.Free:
		t.copy(s, c)
	case <-t.m.Cancel:
		t.over = true
	default:
		t.waiting = true
	}
	return t.over
}

// copy fills c with the next buckets and hands it to the writer; the chunk
// that ends the walk ends the snapshot.
func (t *snapTask) copy(s *Shard, c *msg.SnapChunk) {
	t.waiting = false
	c.Last = s.state.snapshotSlice(c, SliceSize)
	t.m.Out <- c // never blocks: Out has room for every chunk
	if c.Last {
		t.over = true
		s.task = nil
	}
}

// stop abandons the snapshot: the writer learns of it from the engine
// closing.
func (t *snapTask) stop(*Shard) {}
