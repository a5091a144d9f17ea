package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// SYNCULAR_RAW_SENDFILE=off: a whole-range answer is still sent as one
// chunk from its file, but as a fileRange through net's own sendfile
// path, never as a rawRange.
func TestRawSendfileSwitch(t *testing.T) {
	if !rawSendfileOK {
		t.Skip("no raw sendfile path on this platform")
	}
	f := segFile(t, 1<<20, 0, -1)
	source := func() io.Reader {
		if _, err := f.Seek(1000, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		iw := &caddyhttp.IdleTimeoutWriter{
			ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: rec},
			Ctrl:                  http.NewResponseController(rec),
			Deadline:              caddyhttp.IdleDeadline{Timeout: time.Minute},
			MaxChunk:              64 << 10,
			Logger:                zap.NewNop(),
		}
		src, done := sendfileSource(&caddyhttp.ResponseWriterWrapper{ResponseWriter: iw}, f, 500_000)
		done()
		return src
	}
	if src, raw := source().(rawRange); !raw {
		t.Fatalf("switch unset: %T, want the whole range sent with raw sendfile(2) calls", src)
	}
	for _, v := range []string{"off", "OFF", "0", "false", "no"} {
		t.Setenv(envRawSendfile, v)
		src := source()
		if _, raw := src.(rawRange); raw {
			t.Fatalf("%s=%s: still a rawRange", envRawSendfile, v)
		}
		if fr := rangeOf(src); fr == nil || !fr.whole {
			t.Fatalf("%s=%s: %T, want the whole range as a fileRange", envRawSendfile, v, src)
		}
	}
	t.Setenv(envRawSendfile, "on")
	if _, raw := source().(rawRange); !raw {
		t.Fatalf("%s=on: not a rawRange", envRawSendfile)
	}
}

// SYNCULAR_MEMORY_RELEASE=off: stream slots get no releaser (a nil
// *memReleaser schedules nothing), so no debug.FreeOSMemory runs.
func TestMemoryReleaseSwitch(t *testing.T) {
	if s := newStreamSlots(2, 0); s.mem != processMemRelease {
		t.Fatal("switch unset: the stream slots do not release the process's memory")
	}
	t.Setenv(envMemoryRelease, "off")
	s := newStreamSlots(2, 0)
	if s.mem != nil {
		t.Fatalf("%s=off: the stream slots still have a releaser", envMemoryRelease)
	}
	s.mem.schedule() // a nil releaser does nothing, and does not panic
}
