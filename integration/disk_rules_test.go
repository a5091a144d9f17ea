package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
)

// The disk tier's rules, through the real binary: it works only in a
// directory of its own (a foreign or system directory fails `caddy
// validate` and `caddy run` with a clear message, and nothing there is
// touched; an earlier version's directory is adopted), a complete file
// changed in place is never served (it is filled again), and a full
// filesystem never fails a request (the fill's readers go on from the
// store).

// diskBlock is the cache lines of largeSite for a disk tier in dir, with
// a 1 MiB max_entry: segments above it go to the disk tier.
func diskBlock(dir string) string {
	return "max_entry 1MiB\n\t\t\tdisk " + dir
}

// runOnce runs the binary's command (validate or run) on a Caddyfile
// built from largeSite and returns its output and error; run is stopped
// after limit if it does not exit by itself.
func runOnce(t *testing.T, command, store, disk string, limit time.Duration) (string, error) {
	t.Helper()
	dir := t.TempDir()
	site := strings.NewReplacer("STORE", store, "DISK", disk,
		"{{ADMIN}}", fmt.Sprint(freePort(t)), "{{PORT}}", fmt.Sprint(freePort(t)), "{{DIR}}", dir).Replace(largeSite)
	cfg := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(site), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBinary(t), command, "--config", cfg, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"), "HOME="+dir, "SEG_KEY=hex:"+hex.EncodeToString(newKey32(t)))
	b, err := cmd.CombinedOutput()
	out := string(b)
	if log, rerr := os.ReadFile(filepath.Join(dir, "server.log")); rerr == nil { // the site's log
		out += string(log)
	}
	if ctx.Err() != nil {
		return out, fmt.Errorf("still running after %v: %w", limit, ctx.Err())
	}
	return logMessages([]byte(out)), err // JSON log lines as their messages
}

// snapshot lists a directory tree (path → size, mode, mtime).
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %v %d\n", p, fi.Size(), fi.Mode(), fi.ModTime().UnixNano())
		return nil
	})
	return b.String()
}

// TestDiskForeignDirectoryRefused: `caddy validate` and `caddy run` refuse
// a disk directory that holds other files, and system directories, with a
// message naming the directory and the rule; the directory is untouched.
// An earlier version's directory (the tier's own files, no marker) is
// adopted and its file served without a store read.
func TestDiskForeignDirectoryRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sync.db")
	big := pseudoRandom(3<<20, 60)
	id := seedStore(t, path, "wal", big)[0]

	foreign := t.TempDir()
	for name, body := range map[string]string{"thesis.pdf": "keep", "photos/2026/a.jpg": "keep"} {
		p := filepath.Join(foreign, name)
		os.MkdirAll(filepath.Dir(p), 0o750)
		if err := os.WriteFile(p, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(t, foreign)
	for _, command := range []string{"validate", "run"} {
		out, err := runOnce(t, command, sqlStore(path), diskBlock(foreign), 30*time.Second)
		if err == nil || strings.Contains(err.Error(), "still running") {
			t.Fatalf("%s accepted a foreign disk directory (%v):\n%s", command, err, out)
		}
		for _, want := range []string{"cache disk " + foreign, "is not empty and has no .syncular-disk-tier marker", `"thesis.pdf"`, "give the disk tier an empty directory of its own"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", command, want, out)
			}
		}
	}
	if after := snapshot(t, foreign); after != before {
		t.Fatalf("the foreign directory changed:\n%s\n---\n%s", before, after)
	}

	for _, dir := range []string{"/", "/etc", "/var", "/tmp", "/usr/local"} {
		out, err := runOnce(t, "validate", sqlStore(path), diskBlock(dir), 30*time.Second)
		if err == nil || !strings.Contains(out, fmt.Sprintf("cache disk %q is a system directory", dir)) {
			t.Errorf("validate with disk %s: %v\n%s", dir, err, out)
		}
	}
	if _, err := os.Stat("/" + ".syncular-disk-tier"); err == nil {
		t.Fatal("a marker was written in /")
	}

	// An earlier version's directory: the tier's own layout, no marker.
	old := t.TempDir()
	key := strings.TrimPrefix(id, "sha256:")
	os.MkdirAll(filepath.Join(old, "tmp"), 0o750)
	os.MkdirAll(filepath.Join(old, key[:2]), 0o750)
	if err := os.WriteFile(filepath.Join(old, key[:2], key), big, 0o640); err != nil {
		t.Fatal(err)
	}
	if out, err := runOnce(t, "validate", sqlStore(path), diskBlock(old), 30*time.Second); err != nil {
		t.Fatalf("validate refused an earlier version's directory: %v\n%s", err, out)
	}
	e := startLarge(t, sqlStore(path), diskBlock(old), newKey32(t))
	if st, got, n, _, err := fetch(e.url(id), nil); err != nil || st != 200 || got != id || n != int64(len(big)) {
		t.Fatalf("adopted directory: %d, %d bytes, %v", st, n, err)
	}
	m := scrape(t, e.c)
	if m["caddy_syncular_disk_hits_total"] != 1 || storeReads(m) != 0 {
		t.Fatalf("the adopted file was not served from disk:\n%s", dumpSyncular(m))
	}
	if b, err := os.ReadFile(filepath.Join(old, ".syncular-disk-tier")); err != nil || !bytes.HasPrefix(b, []byte("caddy-syncular disk tier\n")) {
		t.Fatalf("adopted directory not marked: %q %v", b, err)
	}
}

// TestDiskChangedFileRefilled: a complete file of the disk tier changed in
// place (its size; its bytes with the same size and a new mtime; only its
// mtime; 4 KiB of its bytes with the mtime set back) is not served: the edge fills it again from the store, and every
// answer verifies.
func TestDiskChangedFileRefilled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sync.db")
	big := pseudoRandom(3<<20, 61)
	id := seedStore(t, path, "wal", big)[0]
	dir := filepath.Join(t.TempDir(), "disk")
	e := startLarge(t, sqlStore(path), diskBlock(dir), newKey32(t))
	key := strings.TrimPrefix(id, "sha256:")
	file := filepath.Join(dir, key[:2], key)
	get := func(step string) {
		t.Helper()
		st, got, n, _, err := fetch(e.url(id), nil)
		if err != nil || st != 200 || got != id || n != int64(len(big)) {
			t.Fatalf("%s: %d, %d bytes, id %s, %v", step, st, n, got, err)
		}
		r := do(t, "GET", e.url(id), map[string]string{"Range": "bytes=100-199"})
		if r.Status != 206 || !bytes.Equal(r.Body, big[100:200]) {
			t.Fatalf("%s: range %d, %d bytes", step, r.Status, len(r.Body))
		}
	}
	get("first fill")
	steps := []struct {
		name   string
		change func()
	}{
		{"appended a byte", func() {
			f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write([]byte{0})
			f.Close()
		}},
		{"same size, other bytes, new mtime", func() {
			fi, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(file, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte("corrupted in place"), 1000)
			f.Close()
			later := fi.ModTime().Add(5 * time.Second)
			os.Chtimes(file, later, later)
		}},
		{"only the mtime", func() {
			fi, _ := os.Stat(file)
			later := fi.ModTime().Add(5 * time.Second)
			os.Chtimes(file, later, later)
		}},
		// Size, inode and mtime as verified: only the change time
		// (st_ctim, which user space cannot set back) shows it.
		{"4 KiB overwritten in place, mtime set back", func() {
			fi, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(file, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(pseudoRandom(4<<10, 62), 1<<20); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if err := os.Chtimes(file, fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
			if now, err := os.Stat(file); err != nil || now.Size() != fi.Size() || !now.ModTime().Equal(fi.ModTime()) {
				t.Fatalf("the change did not keep size and mtime: %v", err)
			}
		}},
	}
	for i, s := range steps {
		s.change()
		get(s.name)
		m := scrape(t, e.c)
		if m["caddy_syncular_disk_fills_total"] != float64(i+2) || m["caddy_syncular_disk_discarded_total"] != float64(i+1) {
			t.Fatalf("after %s: want %d fills and %d discarded:\n%s", s.name, i+2, i+1, dumpSyncular(m))
		}
		if b, err := os.ReadFile(file); err != nil || !bytes.Equal(b, big) {
			t.Fatalf("after %s: the refilled file is not the segment (%v)", s.name, err)
		}
	}
	logs := e.c.Output()
	if b, err := os.ReadFile(filepath.Join(e.c.Dir(), "server.log")); err == nil {
		logs += string(b)
	}
	if !strings.Contains(logs, "discarded a file changed since it was verified") {
		t.Fatalf("no warning about the changed file:\n%s", logs)
	}
}

// mountTmpfs mounts a tmpfs of size on a new directory and unmounts it at
// the test's end. Mounting needs root: otherwise the test is skipped,
// saying so.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a full filesystem needs a tmpfs mounted by the test, which needs root: skipped (store/disk's unit tests inject ENOSPC instead)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (no CAP_SYS_ADMIN?): %v %s", err, out)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			syscall.Unmount(dir, syscall.MNT_DETACH) // the edge may still hold a file
		}
	})
	return dir
}

// throttle forwards to an S3 endpoint, pacing the body of every GET that
// has no Range (a fill) to chunk bytes per pause, so that clients join a
// fill before it meets the full disk; ranged GETs (the handoffs) pass at
// full speed.
func throttle(t *testing.T, target string, chunk int, pause time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(target, "http://")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res := forwardHead(w, r, "http://"+host, r.Body)
		if res == nil {
			return
		}
		defer res.Body.Close()
		if r.Method != http.MethodGet || r.Header.Get("Range") != "" {
			io.Copy(w, res.Body)
			return
		}
		buf := make([]byte, chunk)
		for {
			n, err := io.ReadFull(res.Body, buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
			select {
			case <-time.After(pause):
			case <-r.Context().Done():
				return
			}
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return "http://" + l.Addr().String()
}

// TestDiskFullFilesystem: the disk tier's directory is on a 4 MiB tmpfs
// the test mounts and fills to 2 MiB free; a 3 MiB segment's fill meets
// ENOSPC mid-way while 20 clients read it. Every client gets 200 and the
// whole verified body (the fill's readers go on from the store), and so
// do the requests after it (the directory is bypassed). Needs root.
func TestDiskFullFilesystem(t *testing.T) {
	const size = 3 << 20
	const clients = 20
	big := pseudoRandom(size, 62)
	want := sha256.Sum256(big)
	id := "sha256:" + hex.EncodeToString(want[:])

	for _, tc := range []struct {
		name string
		s3   bool
	}{{"s3 proxy, paced fill", true}, {"sqlite", false}} {
		t.Run(tc.name, func(t *testing.T) {
			mnt := mountTmpfs(t, "4m")
			if err := os.WriteFile(filepath.Join(mnt, "filler"), make([]byte, 2<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(mnt, "segments")
			var e largeEdge
			if tc.s3 {
				srv := s3test.Start(t)
				srv.CreateBucket(t, "segs")
				if got := s3Segment(t, srv, big); got != id {
					t.Fatalf("seeded %s", got)
				}
				slow := throttle(t, srv.Endpoint, 64<<10, 20*time.Millisecond)
				store := strings.Replace(s3Store(srv), srv.Endpoint, slow, 1)
				e = startLarge(t, store, diskBlock(dir), newKey32(t), "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
			} else {
				path := filepath.Join(t.TempDir(), "sync.db")
				if got := seedStore(t, path, "wal", big)[0]; got != id {
					t.Fatalf("seeded %s", got)
				}
				e = startLarge(t, sqlStore(path), diskBlock(dir), newKey32(t))
			}
			url := e.url(id)
			parallelFetchN(t, clients, url, id, size) // every client gets the whole, verified segment
			parallelFetchN(t, 5, url, id, size)       // after: the directory is bypassed
			m := scrape(t, e.c)
			t.Logf("%d clients on a full disk: fill errors %v, handoffs %v, followers %v, streamed %v",
				clients, m["caddy_syncular_disk_fill_errors_total"], m["caddy_syncular_disk_handoffs_total"],
				m["caddy_syncular_disk_followers_total"], m["caddy_syncular_cache_pass_through_total"])
			if m["caddy_syncular_disk_fill_errors_total"] < 1 || m["caddy_syncular_disk_files"] != 0 {
				t.Fatalf("the fill did not meet the full disk:\n%s", dumpSyncular(m))
			}
			// SQLite copies the blob in milliseconds: how many clients
			// joined the fill before it failed (handoffs) and how many
			// came after (streamed) varies, and every one must get the
			// bytes either way. The paced S3 fill is joined by most.
			if tc.s3 && m["caddy_syncular_disk_handoffs_total"] < clients/2 {
				t.Fatalf("want most clients handed over from the paced fill:\n%s", dumpSyncular(m))
			}
			logs := e.c.Output()
			if b, err := os.ReadFile(filepath.Join(e.c.Dir(), "server.log")); err == nil {
				logs += string(b)
			}
			if !strings.Contains(logs, "no space left on device") {
				t.Fatalf("no warning naming the full disk:\n%s", logs)
			}
			if strings.Contains(logs, "segment body interrupted") || strings.Contains(logs, "do not match their id") {
				t.Fatalf("a response was aborted:\n%s", logs)
			}
		})
	}
}
