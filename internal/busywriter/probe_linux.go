package busywriter

import (
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// SQLite's unix VFS locks (os_unix.c). Rollback journal: a reader's
// SHARED lock is a read lock on the 510 bytes from PENDING_BYTE+2 of the
// database file. WAL: every connection holds that lock while open, and a
// reader in a transaction holds a read lock on one of the WAL_NREADER
// read-mark bytes of the -shm file (wal.c: WALINDEX_LOCK_OFFSET 120, the
// read marks from byte 3 of the lock area).
const (
	pendingByte = 0x40000000
	sharedFirst = pendingByte + 2
	sharedSize  = 510

	walReadFirst = 120 + 3
	walReadCount = 5
)

// Probe samples whether a process other than this one holds a SQLite
// read lock on a file, with fcntl(F_GETLK), which reports a conflicting
// lock and takes none, so the probe changes nothing for the writer or
// the edge. Locks of this process (the Writer's) are not reported, as
// POSIX locks never conflict within one process.
type Probe struct {
	f          *os.File
	start, len int64 // the byte range probed
	stop       chan struct{}
	done       sync.WaitGroup
	samples    atomic.Int64
	held       atomic.Int64
}

// StartProbe samples every interval until Stop: the database file's
// SHARED range for a rollback-journal file, the -shm file's read marks
// for a WAL file (as the file's header says when the probe starts). Keep
// it running until every connection of this process to the file is
// closed: closing its descriptor drops this process's POSIX locks on the
// file, so Stop closes it last.
func StartProbe(path string, every time.Duration) (*Probe, error) {
	hdr := make([]byte, 20)
	db, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	_, err = db.ReadAt(hdr, 0)
	if err != nil {
		db.Close()
		return nil, err
	}
	p := &Probe{f: db, stop: make(chan struct{}), start: sharedFirst, len: sharedSize}
	if hdr[18] == 2 { // WAL
		db.Close()
		if p.f, err = os.Open(path + "-shm"); err != nil {
			return nil, err
		}
		p.start, p.len = walReadFirst, walReadCount
	}
	f := p.f
	if _, err := p.sample(); err != nil {
		f.Close()
		return nil, err
	}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			held, err := p.sample()
			if err != nil {
				continue
			}
			p.samples.Add(1)
			if held {
				p.held.Add(1)
			}
		}
	}()
	return p, nil
}

func (p *Probe) sample() (bool, error) {
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: p.start, Len: p.len}
	if err := syscall.FcntlFlock(p.f.Fd(), syscall.F_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != syscall.F_UNLCK, nil
}

// Share is the fraction of samples so far that found a read lock held,
// and the number of samples.
func (p *Probe) Share() (float64, int64) {
	n, h := p.samples.Load(), p.held.Load()
	if n == 0 {
		return 0, 0
	}
	return float64(h) / float64(n), n
}

// Stop ends sampling and closes the descriptor (see StartProbe).
func (p *Probe) Stop() {
	close(p.stop)
	p.done.Wait()
	p.f.Close()
}
