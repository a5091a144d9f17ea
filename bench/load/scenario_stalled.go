package main

import (
	"fmt"
	"log"
	"net"
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
// stall, back within 32 MiB of idle within 10 s.
func stalledScenario(e *env, rep *report) error {
	edge, err := e.startLargeEdge("stalled", "sqlite", "off")
	if err != nil {
		return err
	}
	defer edge.stop()
	idle, _ := procStatus(edge.pid(), "VmRSS")
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
		if after-idle <= 32<<10 {
			back = time.Since(closed)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	log.Printf("(n) %d stalled readers, disk off: RSS idle %.1f, stalled peak %.1f (+%.1f), %.1f MiB after close (back within 32 MiB: %v)",
		stalledReaders, mib(idle), mib(peak), mib(peak-idle), mib(after), back)
	rep.addSection(func(w func(string, ...any)) {
		w("## (n) %d stalled readers, disk tier off\n\n", stalledReaders)
		w("Each connection sends one GET for the 64 MiB SQLite segment (its own token) with a 4 KiB receive buffer and never reads; with `disk off` every answer streams from the store. RSS (`VmRSS`) sampled every 250 ms for 3 s while they stall, then every 250 ms for up to %s after they close.\n\n", stalledSettle)
		backText := "**no**"
		if back >= 0 {
			backText = "yes, " + durMs(back) + " after they closed"
		}
		w("| RSS idle | while stalled (peak) | growth (target ≤ +96 MiB) | after close | back within 32 MiB of idle (target ≤ 10 s) |\n|---:|---:|---:|---:|---|\n")
		w("| %.1f MiB | %.1f MiB | +%.1f MiB: %s | %.1f MiB | %s |\n\n", mib(idle), mib(peak), mib(peak-idle), verdict(peak-idle <= 96<<10), mib(after), backText)
	})
	return nil
}
