package integration

import (
	"compress/gzip"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/token"
)

// Traces: with Caddy's tracing directive on the route, the handler's
// child spans (verify, lookup, fill or open, write) reach an OTLP/HTTP
// receiver run here on loopback, as children of the request's span, with
// the documented names and bounded attributes, and nothing secret in
// them (no token, key, audience or partition id).

const tracingSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	tracing {
		span syncular
	}
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite DBPATH
		untokened reject
	}
	respond 404
}
`

// otlpSpan is the part of an OTLP span this test reads.
type otlpSpan struct {
	traceID, spanID, parentID string
	name                      string
	attrs                     map[string]string
}

// otlpReceiver collects the spans POSTed to /v1/traces (OTLP/HTTP,
// protobuf), decoded with a minimal reader of the protobuf wire format.
type otlpReceiver struct {
	URL   string
	mu    sync.Mutex
	spans []otlpSpan
	errs  []error
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &otlpReceiver{URL: "http://" + l.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				w.WriteHeader(400)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(io.LimitReader(body, 16<<20))
		if err == nil && r.URL.Path != "/v1/traces" {
			err = fmt.Errorf("OTLP export to %s", r.URL.Path)
		}
		var spans []otlpSpan
		if err == nil {
			spans, err = decodeOTLPTraces(b)
		}
		o.mu.Lock()
		o.spans = append(o.spans, spans...)
		if err != nil {
			o.errs = append(o.errs, err)
		}
		o.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(200)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return o
}

func (o *otlpReceiver) all() ([]otlpSpan, []error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]otlpSpan(nil), o.spans...), append([]error(nil), o.errs...)
}

// pbFields calls f for each field of a protobuf message.
func pbFields(b []byte, f func(num int, wire int, v []byte, x uint64) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return errors.New("bad tag")
		}
		b = b[n:]
		num, wire := int(tag>>3), int(tag&7)
		var v []byte
		var x uint64
		switch wire {
		case 0:
			x, n = binary.Uvarint(b)
			if n <= 0 {
				return errors.New("bad varint")
			}
			b = b[n:]
		case 1:
			if len(b) < 8 {
				return errors.New("short fixed64")
			}
			x, b = binary.LittleEndian.Uint64(b), b[8:]
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return errors.New("bad length")
			}
			v, b = b[n:n+int(l)], b[n+int(l):]
		case 5:
			if len(b) < 4 {
				return errors.New("short fixed32")
			}
			x, b = uint64(binary.LittleEndian.Uint32(b)), b[4:]
		default:
			return fmt.Errorf("wire type %d", wire)
		}
		if err := f(num, wire, v, x); err != nil {
			return err
		}
	}
	return nil
}

// decodeOTLPTraces reads an ExportTraceServiceRequest: resource_spans(1)
// > scope_spans(2) > spans(2) > {trace_id 1, span_id 2, parent_span_id 4,
// name 5, attributes 9 > {key 1, value 2 > AnyValue}}.
func decodeOTLPTraces(b []byte) ([]otlpSpan, error) {
	var out []otlpSpan
	err := pbFields(b, func(num, wire int, rs []byte, _ uint64) error {
		if num != 1 || wire != 2 {
			return nil
		}
		return pbFields(rs, func(num, wire int, ss []byte, _ uint64) error {
			if num != 2 || wire != 2 {
				return nil
			}
			return pbFields(ss, func(num, wire int, sp []byte, _ uint64) error {
				if num != 2 || wire != 2 {
					return nil
				}
				s := otlpSpan{attrs: map[string]string{}}
				err := pbFields(sp, func(num, wire int, v []byte, _ uint64) error {
					switch num {
					case 1:
						s.traceID = hex.EncodeToString(v)
					case 2:
						s.spanID = hex.EncodeToString(v)
					case 4:
						s.parentID = hex.EncodeToString(v)
					case 5:
						s.name = string(v)
					case 9:
						var k, val string
						err := pbFields(v, func(num, wire int, kv []byte, _ uint64) error {
							switch num {
							case 1:
								k = string(kv)
							case 2:
								return pbFields(kv, func(num, wire int, av []byte, x uint64) error {
									switch num {
									case 1:
										val = string(av)
									case 2:
										val = strconv.FormatBool(x != 0)
									case 3:
										val = strconv.FormatInt(int64(x), 10)
									case 4:
										val = strconv.FormatFloat(math.Float64frombits(x), 'g', -1, 64)
									default:
										val = fmt.Sprintf("<%d>", num)
									}
									return nil
								})
							}
							return nil
						})
						if err != nil {
							return err
						}
						s.attrs[k] = val
					}
					return nil
				})
				out = append(out, s)
				return err
			})
		})
	})
	return out, err
}

func TestTracingSpans(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sync.db")
	body := pseudoRandom(96<<10, 61)
	id := seedStore(t, path, "wal", body)[0]
	key := newKey32(t)
	recv := newOTLPReceiver(t)
	c := startCaddy(t, strings.ReplaceAll(tracingSite, "DBPATH", path),
		"SEG_KEY=hex:"+hex.EncodeToString(key),
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+recv.URL,
		"OTEL_TRACES_SAMPLER=always_on",
		"OTEL_BSP_SCHEDULE_DELAY=100",
		"OTEL_SERVICE_NAME=syncular-edge-test")
	exp := time.Now().Add(time.Hour).Unix()
	good := token.Sign(key, id, hardDigest, hardAud, exp)
	other := token.Sign(key, id, hardDigest, "aud:p2", exp)
	base := c.Base + "/segments/" + id + "?st="
	for i, tc := range []struct {
		tok  string
		code int
	}{{good, 200}, {good, 200}, {other, 403}} {
		if r := do(t, "GET", base+tc.tok, nil); r.Status != tc.code {
			t.Fatalf("request %d: %d %s", i, r.Status, r.Body)
		}
	}

	// Three traces: each request's span and its children.
	type traceOf struct {
		root     otlpSpan
		children map[string]otlpSpan
	}
	var traces map[string]*traceOf
	var spans []otlpSpan
	collect := func() bool {
		spans, _ = recv.all()
		traces = map[string]*traceOf{}
		for _, s := range spans {
			tr := traces[s.traceID]
			if tr == nil {
				tr = &traceOf{children: map[string]otlpSpan{}}
				traces[s.traceID] = tr
			}
			if s.parentID == "" {
				tr.root = s
			} else {
				tr.children[s.name] = s
			}
		}
		n := 0
		for _, tr := range traces {
			if tr.root.spanID != "" && tr.children["syncular.verify"].spanID != "" {
				if _, ok := tr.children["syncular.write"]; ok || tr.root.attrs["syncular.outcome"] == "sync.forbidden" {
					n++
				}
			}
		}
		return n >= 3
	}
	if waitFor(15*time.Second, collect) < 0 {
		_, errs := recv.all()
		t.Fatalf("spans at the receiver: %d (%v), errors %v", len(spans), spanNames(spans), errs)
	}
	if _, errs := recv.all(); len(errs) > 0 {
		t.Fatalf("receiver: %v", errs)
	}

	allowed := map[string]bool{"syncular.segment_id": true, "syncular.key_slot": true, "syncular.backend": true, "syncular.record": true,
		"syncular.cache": true, "syncular.delivery": true, "syncular.coding": true, "syncular.outcome": true}
	secrets := []string{good, other, hex.EncodeToString(key), hardAud, "aud:p2", "p1", "p2"}
	outcomes := map[string]int{}
	for _, tr := range traces {
		if tr.root.spanID == "" {
			continue
		}
		outcome := tr.root.attrs["syncular.outcome"]
		cache := tr.root.attrs["syncular.cache"]
		t.Logf("trace %s/%s: request span %q, children %v", outcome, cache, tr.root.name, keys(tr.children))
		outcomes[outcome+"/"+cache]++
		want := []string{"syncular.verify", "syncular.lookup"}
		switch cache {
		case "fill":
			want = append(want, "syncular.fill", "syncular.write")
		case "memory":
			want = append(want, "syncular.open", "syncular.write")
		}
		for _, name := range want {
			s, ok := tr.children[name]
			if !ok {
				t.Errorf("%s/%s trace: no %s span (has %v)", outcome, cache, name, keys(tr.children))
				continue
			}
			if s.parentID != tr.root.spanID {
				t.Errorf("%s is not a child of the request's span", name)
			}
			if s.attrs["syncular.segment_id"] != id {
				t.Errorf("%s: segment_id %q", name, s.attrs["syncular.segment_id"])
			}
		}
		if w, ok := tr.children["syncular.write"]; ok {
			if w.attrs["syncular.cache"] != cache || w.attrs["syncular.delivery"] != "serve" || w.attrs["syncular.coding"] != "identity" {
				t.Errorf("write span attributes %v", w.attrs)
			}
		}
		// The first request read the record from the store; the next
		// ones found it in the record cache.
		wantRecord := "memory"
		if cache == "fill" {
			wantRecord = "store"
		}
		if v := tr.children["syncular.lookup"].attrs["syncular.record"]; v != wantRecord {
			t.Errorf("%s/%s: lookup span syncular.record %q, want %q", outcome, cache, v, wantRecord)
		}
		if v := tr.children["syncular.verify"].attrs["syncular.key_slot"]; v != "1" {
			t.Errorf("verify span key_slot %q", v)
		}
		for name, s := range tr.children {
			if !strings.HasPrefix(name, "syncular.") {
				continue
			}
			for k, v := range s.attrs {
				if !allowed[k] {
					t.Errorf("%s: attribute %s not in the documented set", name, k)
				}
				for _, sec := range secrets {
					if strings.Contains(v, sec) || strings.Contains(k, sec) {
						t.Errorf("%s: attribute %s=%q holds a secret", name, k, v)
					}
				}
			}
		}
		for k, v := range tr.root.attrs {
			if strings.HasPrefix(k, "syncular.") {
				for _, sec := range secrets {
					if strings.Contains(v, sec) {
						t.Errorf("request span: %s=%q holds a secret", k, v)
					}
				}
			} else if strings.Contains(v, good) || strings.Contains(v, other) {
				t.Logf("note: Caddy's own request span attribute %s carries the token", k)
			}
		}
	}
	if outcomes["granted/fill"] != 1 || outcomes["granted/memory"] != 1 || outcomes["sync.forbidden/"] != 1 {
		t.Fatalf("traces by outcome/cache: %v", outcomes)
	}
}

func spanNames(spans []otlpSpan) []string {
	var n []string
	for _, s := range spans {
		n = append(n, s.name)
	}
	return n
}

func keys(m map[string]otlpSpan) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}
