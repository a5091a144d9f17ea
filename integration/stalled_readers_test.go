package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

const stalledSite = siteGlobals + `http://127.0.0.1:{{PORT}} {
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
//
// Two crowds. The first closes without reading a byte of its answers:
// then nothing allocates after it leaves, so its memory comes back only
// because the edge returns it when its streams go idle after an overload
// (without that, the Go runtime keeps it until its periodic collection,
// minutes later, and the bound fails). The second takes its answers
// (one to four 200s, the rest 503 with Retry-After) before closing.
func TestStalledReadersMemory(t *testing.T) {
	const (
		readers   = 300
		segMiB    = 20
		growMiB   = 96
		settleMiB = 32
		heapMiB   = 6
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
	idleHeap := goHeapHeldKB(t, c)

	target := strings.TrimPrefix(u, c.Base)
	var conns []net.Conn
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	crowd := func() {
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
	}
	closeAll := func() {
		for _, conn := range conns {
			conn.Close()
		}
		conns = nil
	}
	grown := func(wave string, stalled int) {
		t.Logf("%s: %d stalled readers of a %d MiB segment (disk off): RSS %d MiB idle → %d MiB (+%d MiB)",
			wave, readers, segMiB, idle>>10, stalled>>10, (stalled-idle)>>10)
		if stalled-idle > growMiB<<10 {
			t.Errorf("%s: RSS grew by %d MiB with %d stalled readers, more than %d MiB", wave, (stalled-idle)>>10, readers, growMiB)
		}
	}

	// The first crowd stalls, then leaves without reading.
	crowd()
	grown("crowd 1", c.rssKB(t))
	stalledHeap := goHeapHeldKB(t, c)
	closeAll()
	closed := time.Now()
	var after, afterHeap int
	for {
		after, afterHeap = c.rssKB(t), goHeapHeldKB(t, c)
		if (after-idle <= settleMiB<<10 && afterHeap-idleHeap <= heapMiB<<10) || time.Since(closed) > 10*time.Second {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("crowd 1 closed unread: after %v RSS %d MiB (idle %d MiB), Go heap held %d KiB (idle %d KiB, stalled %d KiB)",
		time.Since(closed).Round(100*time.Millisecond), after>>10, idle>>10, afterHeap, idleHeap, stalledHeap)
	if after-idle > settleMiB<<10 {
		t.Errorf("RSS %d MiB 10 s after the readers closed, more than %d MiB above idle (%d MiB)", after>>10, settleMiB, idle>>10)
	}
	if afterHeap-idleHeap > heapMiB<<10 {
		t.Errorf("Go heap held %d KiB 10 s after the readers closed, more than %d MiB above idle (%d KiB): the crowd's memory was not returned", afterHeap, heapMiB, idleHeap)
	}

	// The second crowd stalls, then takes its answers. Readers past the
	// cap wait for a slot (15 s), then are refused 503 edge.overloaded
	// with a Retry-After between 1 and 5 s.
	crowd()
	grown("crowd 2", c.rssKB(t))
	statuses := map[string]int{}
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
	t.Logf("crowd 2 answers %v", statuses)
	for st := range statuses {
		if st != "200 OK" && st != "503 Service Unavailable" {
			t.Errorf("a reader was answered %q", st)
		}
	}
	if statuses["200 OK"] == 0 || statuses["200 OK"] > 4 {
		t.Errorf("%d readers streamed at once, want 1 to 4", statuses["200 OK"])
	}
	closeAll()

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

// goHeapHeldKB is the heap memory the edge's Go runtime holds from the
// system (HeapSys - HeapReleased of expvar's memstats), in KiB.
func goHeapHeldKB(t *testing.T, c *caddyProc) int {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/vars", c.AdminPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Memstats struct{ HeapSys, HeapReleased uint64 } `json:"memstats"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.Memstats.HeapSys == 0 {
		t.Fatalf("admin /debug/vars: %v", err)
	}
	return int((v.Memstats.HeapSys - v.Memstats.HeapReleased) >> 10)
}
