package main

import (
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"
)

const (
	stalledReaders = 300
	stalledSettle  = 10 * time.Second
)

// stalledScenario is (n): stalledReaders connections request the 64 MiB
// SQLite segment with the disk tier off (so each answer streams from the
// store) and never read; the edge's RSS is read while they stall and for
// stalledSettle after they close. Targets: at most +96 MiB while they
// stall, back within 32 MiB of idle within 10 s (and still there at the
// end of the 10 s: RSS is sampled for all of them).
func stalledScenario(e *env, rep *report) error {
	edge, err := e.startLargeEdge("stalled", "sqlite", "off")
	if err != nil {
		return err
	}
	defer edge.stop()
	idle, _ := procStatus(edge.pid(), "VmRSS")
	idleHeap := edgeHeap(edge.admin)
	conns := make([]net.Conn, 0, stalledReaders)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < stalledReaders; i++ {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", edge.port))
		if err != nil {
			return err
		}
		c.(*net.TCPConn).SetReadBuffer(4 << 10)
		conns = append(conns, c)
		u := edge.url(i)
		target := u[len(fmt.Sprintf("http://127.0.0.1:%d", edge.port)):]
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", target)
	}
	// Sample while they stall: the streams fill their socket buffers and
	// block, the readers past the edge's cap wait for a slot.
	var peak int64
	for t0 := time.Now(); time.Since(t0) < 3*time.Second; time.Sleep(250 * time.Millisecond) {
		v, _ := procStatus(edge.pid(), "VmRSS")
		peak = max(peak, v)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	closed := time.Now()
	var after int64
	var back time.Duration = -1
	for time.Since(closed) < stalledSettle {
		after, _ = procStatus(edge.pid(), "VmRSS")
		if after-idle > 32<<10 {
			back = -1 // above the bound again
		} else if back < 0 {
			back = time.Since(closed)
		}
		time.Sleep(250 * time.Millisecond)
	}
	log.Printf("(n) %d stalled readers, disk off: RSS idle %.1f, stalled peak %.1f (+%.1f), %.1f MiB %s after close (back within 32 MiB and staying: %v); Go heap idle %s, after %s",
		stalledReaders, mib(idle), mib(peak), mib(peak-idle), mib(after), stalledSettle, back, idleHeap, edgeHeap(edge.admin))
	rep.addSection(func(w func(string, ...any)) {
		w("## (n) %d stalled readers, disk tier off\n\n", stalledReaders)
		w("Each connection sends one GET for the 64 MiB SQLite segment (its own token) with a 4 KiB receive buffer and never reads; with `disk off` every answer streams from the store. RSS (`VmRSS`) sampled every 250 ms for 3 s while they stall, then every 250 ms for up to %s after they close.\n\n", stalledSettle)
		backText := "**no**"
		if back >= 0 {
			backText = "yes, " + durMs(back) + " after they closed"
		}
		w("| RSS idle | while stalled (peak) | growth (target ≤ +96 MiB) | %s after close | back within 32 MiB of idle for good (target ≤ 10 s) |\n|---:|---:|---:|---:|---|\n", stalledSettle)
		w("| %.1f MiB | %.1f MiB | +%.1f MiB: %s | %.1f MiB | %s |\n\n", mib(idle), mib(peak), mib(peak-idle), verdict(peak-idle <= 96<<10), mib(after), backText)
	})
	return nil
}

// edgeHeap summarises the Go runtime's memory of the edge whose admin
// endpoint listens on port (expvar's memstats): live heap, heap held
// from the system (not released), stacks, everything else the runtime
// holds, in MiB; "?" when unreadable. What RSS holds beyond these is not
// the Go runtime's (the binary's pages, SQLite's page caches).
func edgeHeap(admin int) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/vars", admin))
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	var v struct {
		Memstats struct {
			HeapAlloc, HeapSys, HeapReleased, StackSys, Sys uint64
			NumGC                                           uint32
		} `json:"memstats"`
	}
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return "?"
	}
	m := v.Memstats
	other := m.Sys - m.HeapSys - m.StackSys
	return fmt.Sprintf("live %.1f, heap held %.1f, stacks %.1f, runtime other %.1f MiB, %d GCs",
		float64(m.HeapAlloc)/(1<<20), float64(m.HeapSys-m.HeapReleased)/(1<<20), float64(m.StackSys)/(1<<20), float64(other)/(1<<20), m.NumGC)
}
