package store

import "time"

// The adaptive limit of the store read gate (FairOptions.Adaptive), after
// TCP Vegas: how many reads the store serves at once without queueing
// them inside itself. A store that saturates (a SQLite file on the edge's
// cores, an S3 server on a busy host) slows every read in proportion to
// how many run beyond its parallelism; letting more in only lengthens
// each of them, and a read admitted for another tenant then runs as
// slowly as the storm's. A store whose latency does not grow with load (a
// remote S3, bound by the network's round trip) keeps the whole ceiling.
//
// The signal is the time a read holds its slot. Each window of as many
// reads as the limit, the gate compares the window's fastest read with
// the fastest of the last minute or so (the store's unloaded latency,
// base). The fastest, not the mean: record lookups and small fills keep
// it near base whenever the store is not queueing, whatever large fills
// run beside them; only when every read of the window is slow is the
// store itself slow. From the ratio, Vegas's estimate of the reads queued
// inside the store is
//
//	queued = limit × (1 − base/fastest)
//
// and the limit follows it: adaptSlowStep more while queued < 1 (slow
// start, from the floor), one more while queued ≤ adaptAlpha, unchanged
// up to adaptBeta, and above that cut to limit − queued + adaptAlpha (the
// store's parallelism, plus the allowance), never below the floor.
//
// A window counts only reads admitted under the current limit (started
// at or after the limit last changed). A read admitted before a change
// ran beside as many reads as the old limit let in, so its latency says
// nothing of the new one: counting it, a cut taken because 16 reads ran
// at once was followed by a second cut from the same 16 reads ending,
// and a growth was judged by reads that ran at the old, smaller count.
//
// It starts at the floor, so that the first reads of a fresh edge in a
// storm measure base near the unloaded latency: starting at the ceiling,
// base would be learned from reads already slowed by the storm. Slow
// start adds adaptSlowStep per window rather than doubling: while a
// storm is already queued, every step up is taken at once by the queue,
// and a doubling step overshoots a store of small parallelism by as many
// reads again as it had, each of them slowing the other tenants' reads
// for a whole window before the cut (fair_storm_test.go measures tenant
// B's p95 beside such a storm; docs/performance.md, "The adaptive limit's
// step and thresholds"). Vegas's usual thresholds of 1 and 2 queued reads
// were tried in place of 2 and 4: no better for B on a saturating store,
// and on a store of jittered latency they read the jitter as queueing,
// held the limit near the floor and refused some of the storm's
// downloads, where 2 and 4 refused none (same section).

const (
	// AdaptiveFloor is the least the adaptive limit falls to (at most
	// Slots): 2 reads keep a store of any kind busy while a third
	// waits, and each tenant's next read waits for at most one of
	// them to end.
	AdaptiveFloor = 2
	// adaptAlpha, adaptBeta: the reads queued inside the store (Vegas's
	// estimate) below which the limit grows by one, and above which it
	// is cut.
	adaptAlpha = 2
	adaptBeta  = 4
	// adaptSlowStep: the slow start's growth per window.
	adaptSlowStep = 2
	// adaptBasePeriod: base is the fastest read of the current and the
	// previous period, so a store that became slower for good is
	// learned again within two periods.
	adaptBasePeriod = 30 * time.Second
)

// adaptive is the limit's state, guarded by the gate's mutex.
type adaptive struct {
	floor, ceiling int
	limit          int
	slowStart      bool

	winFastest time.Duration // fastest read of the window
	winN       int           // reads in the window
	since      time.Time     // when limit last changed: older reads are not the window's

	baseCur, basePrev time.Duration // fastest of this period and the last; 0: none
	periodStart       time.Time
}

func newAdaptive(ceiling int) *adaptive {
	floor := min(AdaptiveFloor, ceiling)
	return &adaptive{floor: floor, ceiling: ceiling, limit: floor, slowStart: true}
}

// base is the store's unloaded latency as last seen; 0: unknown.
func (a *adaptive) base() time.Duration {
	switch {
	case a.basePrev == 0:
		return a.baseCur
	case a.baseCur == 0:
		return a.basePrev
	default:
		return min(a.baseCur, a.basePrev)
	}
}

// sample takes the latency of one read that ended at now and returns
// the limit.
func (a *adaptive) sample(held time.Duration, now time.Time) int {
	if a.periodStart.IsZero() || now.Sub(a.periodStart) >= adaptBasePeriod {
		a.basePrev, a.baseCur, a.periodStart = a.baseCur, held, now
	} else if held < a.baseCur {
		a.baseCur = held
	}
	if now.Add(-held).Before(a.since) {
		// Admitted under an earlier limit: it tells the base (any
		// read may be the fastest), not the window.
		return a.limit
	}
	if a.winN == 0 || held < a.winFastest {
		a.winFastest = held
	}
	a.winN++
	if a.winN < a.limit {
		return a.limit
	}
	fastest := a.winFastest
	a.winN, a.winFastest = 0, 0
	base := a.base()
	queued := float64(a.limit) * (1 - float64(base)/float64(fastest))
	was := a.limit
	switch {
	case queued < 1 && a.slowStart:
		a.limit += adaptSlowStep
	case queued <= adaptAlpha:
		a.slowStart = false
		a.limit++
	case queued > adaptBeta:
		a.slowStart = false
		a.limit -= int(queued) - adaptAlpha
	default:
		a.slowStart = false
	}
	a.limit = max(a.floor, min(a.limit, a.ceiling))
	if a.limit != was {
		a.since = now
	}
	return a.limit
}
