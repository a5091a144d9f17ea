package sqlite

import (
	"context"
	"database/sql"
	"time"
)

// Batches: the read transactions that answer the queued lookups (why they
// are batched, and group reads: records.go).

// runBatches reads the queued lookups, a batch at a time, until none is
// left. Its context is its own: a caller that gives up does not fail the
// others' read.
func (h *sqliteHandle) runBatches() {
	r := h.records
	defer r.wg.Done()
	// Lookups come in bursts (a cold storm, records expiring together):
	// a moment's wait lets the rest of the burst join the first batch.
	time.Sleep(batchGather)
	yields := 0
	for {
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		f := r.pending[0].flags
		var calls, rest []*recordCall
		for _, c := range r.pending {
			if c.flags == f && len(calls) < maxBatch {
				calls = append(calls, c)
			} else {
				rest = append(rest, c)
			}
		}
		r.pending = rest
		r.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), h.busy+time.Second)
		if h.readLockFree(ctx, f, calls) {
			cancel()
			for _, c := range calls {
				close(c.done)
			}
			continue
		}
		var done int
		err := h.retryBusy(ctx, func() (err error) {
			done, err = h.readBatch(ctx, f, calls, yields < maxYields)
			return err
		})
		cancel()
		if err != nil {
			done = len(calls)
		}
		for _, c := range calls[:done] {
			if err != nil {
				c.rec, c.err = nil, err
			}
			close(c.done)
		}
		if done < len(calls) {
			// A writer began: the rest waits for it (retryBusy's
			// awaitWriter) at the front of the queue.
			yields++
			r.stats.rrYields.Add(1)
			if !writerActive(h.probe) {
				time.Sleep(time.Millisecond) // no lock seen (or no probe): do not spin
			}
			r.mu.Lock()
			r.pending = append(calls[done:len(calls):len(calls)], r.pending...)
			r.mu.Unlock()
		}
	}
}

// readBatch reads calls' records in one read transaction and reports
// how many it read. A lock error (or any error of the transaction
// itself) is returned for the whole batch; a record that does not decode
// is that call's error. With yield, it stops early, releasing its lock,
// when a writer's journal appears beside the file: that writer's commit
// needs every reader gone, and comes after the journal is synced, so a
// reader that leaves at once does not fail it.
func (h *sqliteHandle) readBatch(ctx context.Context, f shapeFlags, calls []*recordCall, yield bool) (int, error) {
	st, err := h.lookupStmt(ctx, f)
	if err != nil {
		return 0, err
	}
	conn, err := h.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil) // deferred: SHARED from the first read to the end
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	tst := tx.StmtContext(ctx, st)
	var vers [16]byte
	locked, versOK := false, false
	done := 0
	for _, c := range calls {
		if yield && h.records.journalLive() {
			break
		}
		c.rec, c.ver, c.err = scanLookup(ctx, tst, f, c.id)
		if isBusy(c.err) || ctx.Err() != nil {
			if c.err == nil {
				c.err = ctx.Err()
			}
			return 0, c.err
		}
		done++
		if c.err == nil && !locked {
			// The transaction holds its SHARED lock from this read to
			// its end: no writer can change the file meanwhile, so the
			// header is the one of the data this batch reads.
			locked = true
			vers, versOK = h.records.header()
		}
	}
	var grp map[string]groupRec
	if done == len(calls) {
		grp = h.readGroup(ctx, tst, f, calls, yield)
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	if done == 0 {
		return 0, nil
	}
	h.records.stats.rrBatches.Add(1)
	h.records.stats.rrBatched.Add(int64(done))
	h.records.stats.rrGrouped.Add(int64(len(grp)))
	for _, c := range calls {
		if len(c.also) > 0 {
			c.group = grp // read-only from here on
		}
	}
	if versOK {
		h.records.keep(vers, calls[:done], f, grp)
	}
	return done, nil
}

// readGroup reads, in readBatch's transaction (tst), the group ids of
// calls that are not calls of the batch, up to maxGroupRead of them: the
// ones found and decoded. It stops, keeping what it read, when a writer's
// journal appears (with yield) or a read fails.
func (h *sqliteHandle) readGroup(ctx context.Context, tst *sql.Stmt, f shapeFlags, calls []*recordCall, yield bool) map[string]groupRec {
	var want []string
	seen := make(map[string]bool, len(calls))
	for _, c := range calls {
		seen[c.id] = true
	}
	for _, c := range calls {
		for _, id := range c.also {
			if !seen[id] && len(want) < maxGroupRead {
				seen[id] = true
				want = append(want, id)
			}
		}
	}
	var grp map[string]groupRec
	for _, id := range want {
		if yield && h.records.journalLive() {
			break
		}
		rec, ver, err := scanLookup(ctx, tst, f, id)
		if err != nil {
			if isBusy(err) || ctx.Err() != nil {
				break
			}
			continue // undecodable: not refreshed
		}
		if rec == nil {
			continue
		}
		if grp == nil {
			grp = make(map[string]groupRec, len(want))
		}
		grp[id] = groupRec{rec: rec, ver: ver}
	}
	return grp
}
