package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sendfile(2) for disk tier answers: every answer from a complete file of
// the disk tier (identity or a compressed variant, whole or a Range)
// reaches sendfile through Caddy's response writers, counted by strace
// attached to the real binary while the answers go out. Stock Caddy's
// file_server on the same bytes is the control: its body goes through
// read/write (Caddy's IdleTimeoutWriter wraps its *io.LimitedReader in
// another one), which shows the count sees a copy when there is one.

// sendfileSize is above max_entry (8 MiB by default), so the segment is
// served from the disk tier; the copy path would cost 32 KiB per read.
const sendfileSize = 12 << 20

// straceBinary is strace (scripts/tools.sh strace installs it).
func straceBinary(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("strace")
	if err != nil {
		t.Fatalf("strace not on PATH: run `scripts/tools.sh strace` (make integration does): %v", err)
	}
	return p
}

// syscallCounts is strace -c's call count per system call.
type syscallCounts map[string]int

// bodyCopies is the calls that would move body bytes through user space.
func (c syscallCounts) bodyCopies() int { return c["read"] + c["write"] + c["pread64"] }

// straceDuring attaches strace to every thread of pid, runs f, detaches
// and returns the calls of sendfile, read, write, pread64 and splice
// made meanwhile.
func straceDuring(t *testing.T, pid int, f func()) syscallCounts {
	t.Helper()
	out := filepath.Join(t.TempDir(), "strace.txt")
	cmd := exec.Command(straceBinary(t), "-f", "-c", "-o", out,
		"-e", "trace=sendfile,read,write,pread64,splice", "-p", strconv.Itoa(pid))
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	detach := func() error {
		_ = cmd.Process.Signal(os.Interrupt) // strace detaches and writes its summary
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			return fmt.Errorf("strace did not exit: %s", stderr.String())
		}
	}
	if waitFor(15*time.Second, func() bool { return allTraced(pid, cmd.Process.Pid) }) < 0 {
		detach()
		t.Fatalf("strace did not attach to every thread of %d: %s", pid, stderr.String())
	}
	f()
	if err := detach(); err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("strace summary: %v (%s)", err, stderr.String())
	}
	return parseStraceSummary(t, b)
}

// allTraced reports whether every thread of pid has tracer as its tracer.
func allTraced(pid, tracer int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			return false
		}
		if !bytes.Contains(b, []byte(fmt.Sprintf("\nTracerPid:\t%d\n", tracer))) {
			return false
		}
	}
	return true
}

// parseStraceSummary reads strace -c's table: "% time seconds usecs/call
// calls [errors] syscall".
func parseStraceSummary(t *testing.T, b []byte) syscallCounts {
	t.Helper()
	c := syscallCounts{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	header := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "%" {
			header = true
			continue
		}
		if !header || len(f) < 5 || strings.HasPrefix(f[0], "-") || f[len(f)-1] == "total" {
			continue
		}
		n, err := strconv.Atoi(f[3])
		if err != nil {
			t.Fatalf("strace summary line %q", sc.Text())
		}
		c[f[len(f)-1]] = n
	}
	if !header {
		t.Fatalf("no strace summary in:\n%s", b)
	}
	return c
}

// compressibleRows is n bytes of text rows (compress to about half).
func compressibleRows(n int) []byte {
	noise := pseudoRandom(n/4+64, 21)
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "row %08d,task-%x,open\n", i, noise[i%(len(noise)-8):i%(len(noise)-8)+8])
	}
	return b.Bytes()[:n]
}

func TestSendfileDiskTier(t *testing.T) {
	straceBinary(t)
	seg := compressibleRows(sendfileSize)
	path := filepath.Join(t.TempDir(), "sync.db")
	id := seedStore(t, path, "wal", seg)[0]
	e := startLarge(t, sqlStore(path), "disk "+filepath.Join(t.TempDir(), "disk"), newKey32(t))
	url := e.url(id)

	get := func(t *testing.T, hdr map[string]string) response {
		t.Helper()
		r, err := rawGet("GET", url, hdr)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// The first answer fills the disk tier; the variant is built after.
	if r := get(t, nil); r.Status != 200 || !bytes.Equal(r.Body, seg) {
		t.Fatalf("first answer: %d, %d bytes", r.Status, len(r.Body))
	}
	gz := map[string]string{"Accept-Encoding": "gzip"}
	browser := map[string]string{"Accept-Encoding": "gzip, deflate, br, zstd"}
	for _, w := range []struct {
		hdr    map[string]string
		coding string
	}{{gz, "gzip"}, {browser, "zstd"}} {
		if waitFor(60*time.Second, func() bool { return get(t, w.hdr).Header.Get("Content-Encoding") == w.coding }) < 0 {
			t.Fatalf("no %s variant within 60s", w.coding)
		}
	}
	time.Sleep(200 * time.Millisecond) // the variant's verification has returned its reads

	const perCase = 3
	mid := fmt.Sprintf("bytes=%d-%d", 777, sendfileSize-300_002)
	cases := []struct {
		name   string
		hdr    map[string]string
		status int
		coding string
		want   []byte
	}{
		{"identity whole", nil, 200, "", seg},
		{"identity Range inside the file", map[string]string{"Range": mid}, 206, "", seg[777 : sendfileSize-300_001]},
		{"identity Range to the end", map[string]string{"Range": "bytes=1000-"}, 206, "", seg[1000:]},
		{"gzip variant whole", gz, 200, "gzip", seg},
		{"zstd variant whole", browser, 200, "zstd", seg},
		// Range requests are answered from the identity bytes whatever
		// Accept-Encoding says (protocol §6): a Range from a client
		// accepting the variant's coding is this one.
		{"Range accepting gzip", map[string]string{"Range": mid, "Accept-Encoding": "gzip"}, 206, "", seg[777 : sendfileSize-300_001]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var bodyBytes int
			counts := straceDuring(t, e.c.pid(), func() {
				for range perCase {
					r := get(t, tc.hdr)
					if r.Status != tc.status || r.Header.Get("Content-Encoding") != tc.coding {
						t.Fatalf("status %d, Content-Encoding %q; want %d %q", r.Status, r.Header.Get("Content-Encoding"), tc.status, tc.coding)
					}
					got, err := decodeAs(tc.coding, r.Body)
					if err != nil || !bytes.Equal(got, tc.want) {
						t.Fatalf("body decodes to %d bytes (%v), not the %d expected", len(got), err, len(tc.want))
					}
					bodyBytes = len(r.Body)
				}
			})
			t.Logf("%d answers of %d body bytes: %v", perCase, bodyBytes, counts)
			if counts["sendfile"] < perCase {
				t.Fatalf("%d sendfile calls for %d answers: %v", counts["sendfile"], perCase, counts)
			}
			// One chunk per answer (caddymodule's oneChunk): a few calls
			// of up to 2 MiB each (and the odd EAGAIN), where Caddy's
			// idle timeout writer left to itself makes one or more per
			// 64 KiB chunk. A Caddy upgrade that changes the writer's
			// MaxChunk or its wrapped writer ends here.
			if limit := perCase * (bodyBytes/(512<<10) + 8); counts["sendfile"] > limit {
				t.Fatalf("%d sendfile calls for %d answers (limit %d; chunked by the idle timeout writer: ~%d): the answer no longer goes as one chunk: %v",
					counts["sendfile"], perCase, limit, perCase*bodyBytes/(64<<10), counts)
			}
			// Per answer: the request read, the header write, the 512
			// bytes net/http reads itself, the access log line, and for a
			// range inside the file its tail (under 64 KiB: a few 32 KiB
			// reads and writes). A copy would make bodyBytes/32 KiB of
			// each.
			if limit := perCase * 16; counts.bodyCopies() > limit {
				t.Fatalf("%d read/write/pread64 calls for %d answers (limit %d; a copy makes ~%d): %v",
					counts.bodyCopies(), perCase, limit, 2*perCase*bodyBytes/(32<<10), counts)
			}
		})
	}

	// The control: stock Caddy's file_server on the same bytes.
	t.Run("file_server control", func(t *testing.T) {
		www := t.TempDir()
		if err := os.WriteFile(filepath.Join(www, "seg"), seg, 0o644); err != nil {
			t.Fatal(err)
		}
		plain := startCaddyBin(t, plainCaddyBinary(t), `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{PORT}} {
	root * `+www+`
	file_server
}
`)
		counts := straceDuring(t, plain.pid(), func() {
			for range perCase {
				r, err := rawGet("GET", plain.Base+"/seg", nil)
				if err != nil || r.Status != 200 || !bytes.Equal(r.Body, seg) {
					t.Fatalf("file_server: %d, %d bytes, %v", r.Status, len(r.Body), err)
				}
			}
		})
		t.Logf("file_server, %d answers of %d bytes: %v", perCase, len(seg), counts)
		if counts.bodyCopies() < perCase*len(seg)/(64<<10) {
			t.Fatalf("file_server: only %d read/write calls for %d answers: the count misses copies, or stock Caddy now sends with sendfile (then this control needs another copying server): %v",
				counts.bodyCopies(), perCase, counts)
		}
	})
}
