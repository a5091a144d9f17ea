package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

const stalledSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	log {
		level INFO
		output file {{DIR}}/server.log
	}
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite STORE_PATH
		cache {
			disk off
		}
	}
	respond "not the segment handler" 418
}
`

// TestStalledReadersMemory measures, through the real binary, what
// readers that request a large SQLite segment and then never read cost
// with the disk tier off (the segment, above max_entry, streams from the
// store for each request): 300 stalled readers of a 20 MiB segment may
// add at most 96 MiB of RSS, and within 10 s of their closing RSS must be
// back within 32 MiB of idle. A measurement with generous bounds, read
// from /proc/<pid>/status. The edge streams at most 4 such answers at
// once per handler; the others wait for a slot, then are refused 503
// edge.overloaded.
func TestStalledReadersMemory(t *testing.T) {
	const (
		readers   = 300
		segMiB    = 20
		growMiB   = 96
		settleMiB = 32
	)
	path := t.TempDir() + "/sync.db"
	seg := pseudoRandom(segMiB<<20, 22)
	ids := seedStore(t, path, "wal", seg)
	key := randKey(t)
	c := startCaddy(t, strings.Replace(stalledSite, "STORE_PATH", path, 1), "SEG_KEY="+key)
	u := signURL(c.Base, key, ids[0], 15*time.Minute)
	checkSegment(t, do(t, "GET", u, nil), ids[0])
	time.Sleep(time.Second)
	idle := c.rssKB(t)

	target := strings.TrimPrefix(u, c.Base)
	conns := make([]net.Conn, 0, readers)
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	statuses := map[string]int{}
	for i := 0; i < readers; i++ {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.Port))
		if err != nil {
			t.Fatal(err)
		}
		conn.(*net.TCPConn).SetReadBuffer(4 << 10)
		conns = append(conns, conn)
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", target)
	}
	time.Sleep(2 * time.Second)
	stalled := c.rssKB(t)
	// Readers past the cap wait for a slot (15 s), then are refused 503
	// edge.overloaded with a Retry-After between 1 and 5 s.
	for i, conn := range conns {
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		res, err := http.ReadResponse(bufio.NewReaderSize(conn, 64), nil)
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		statuses[res.Status]++
		if res.StatusCode == 503 {
			b, _ := io.ReadAll(res.Body)
			if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); !strings.Contains(string(b), `"code":"edge.overloaded"`) || ra < 1 || ra > 5 {
				t.Fatalf("reader %d refused with Retry-After %q: %s", i, res.Header.Get("Retry-After"), b)
			}
		}
	}
	t.Logf("%d stalled readers of a %d MiB segment (disk off): RSS %d MiB idle → %d MiB (+%d MiB); answers %v",
		readers, segMiB, idle>>10, stalled>>10, (stalled-idle)>>10, statuses)
	if stalled-idle > growMiB<<10 {
		t.Errorf("RSS grew by %d MiB with %d stalled readers, more than %d MiB", (stalled-idle)>>10, readers, growMiB)
	}
	for st := range statuses {
		if st != "200 OK" && st != "503 Service Unavailable" {
			t.Errorf("a reader was answered %q", st)
		}
	}
	if statuses["200 OK"] == 0 || statuses["200 OK"] > 4 {
		t.Errorf("%d readers streamed at once, want 1 to 4", statuses["200 OK"])
	}

	for _, conn := range conns {
		conn.Close()
	}
	conns = nil
	closed := time.Now()
	var after int
	for {
		after = c.rssKB(t)
		if after-idle <= settleMiB<<10 || time.Since(closed) > 10*time.Second {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("after the readers closed: RSS %d MiB after %v (idle %d MiB)", after>>10, time.Since(closed).Round(100*time.Millisecond), idle>>10)
	if after-idle > settleMiB<<10 {
		t.Errorf("RSS %d MiB 10 s after the readers closed, more than %d MiB above idle (%d MiB)", after>>10, settleMiB, idle>>10)
	}
	// The slots came back: the segment is served again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := do(t, "GET", u, nil)
		if r.Status == 200 {
			checkSegment(t, r, ids[0])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d 10 s after the stalled readers closed: slots not released", r.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
