package caddymodule

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/syncular/caddy-syncular/presign"
	"github.com/syncular/caddy-syncular/segid"
)

// A redirect handler's answer in the grant's last second, where no
// whole-second URL fits, streams the bytes: it is labelled proxy alike in
// {http.syncular.delivery}, the debug line and the metrics; a redirect is
// labelled redirect in all three.
func TestTooShortGrantLabelledProxy(t *testing.T) {
	fs := newFakeStore()
	body := bytes.Repeat([]byte("last-second"), 100)
	short := fs.add(body, pub("p1", digestA, testNow.Add(500*time.Millisecond)))
	long := fs.add(append(body, '!'), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, func(h *Handler) {
		h.Store = &StoreConfig{Backend: "s3", S3: &S3Config{Bucket: "segs"}}
		h.Delivery = DeliveryRedirect
	})
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalECPrivateKey(k)
	h.cdn, err = presign.NewCloudFrontSigner(func(id segid.ID) string { return "segs/" + id.Hex() }, presign.CloudFrontOptions{
		Domain: "d111111abcdef8.cloudfront.net", KeyPairID: cdnTestKeyID, TTL: time.Minute,
		PrivateKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}),
	})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	h.logger = zap.New(core)
	h.metrics = newHandlerMetrics(moduleCollectors(), unknownServer, "s3", DeliveryRedirect, len(h.Keys))
	h.metrics.withProxied("s3", len(h.Keys))

	for _, tc := range []struct {
		id     string
		status int
		label  string
	}{
		{short, http.StatusOK, DeliveryProxy},
		{long, http.StatusFound, DeliveryRedirect},
	} {
		before := map[string]float64{DeliveryProxy: requestsOf(outcomeGranted, DeliveryProxy), DeliveryRedirect: requestsOf(outcomeGranted, DeliveryRedirect)}
		logs.TakeAll()
		rec, repl := serve(t, h, "GET", "/sync/segments/"+tc.id+"?st="+mintToken(tc.id, digestA, "aud:p1", testNow.Add(10*time.Minute)), nil)
		if rec.Code != tc.status {
			t.Fatalf("%s: status %d, want %d", tc.label, rec.Code, tc.status)
		}
		if got := replString(repl, "http.syncular.delivery"); got != tc.label {
			t.Errorf("%s: placeholder delivery %q", tc.label, got)
		}
		lines := logs.FilterMessage("segment decision").All()
		if len(lines) != 1 || lines[0].ContextMap()["delivery"] != tc.label {
			t.Errorf("%s: debug line %v", tc.label, lines)
		}
		for label, n := range before {
			want := n
			if label == tc.label {
				want++
			}
			if got := requestsOf(outcomeGranted, label); got != want {
				t.Errorf("%s: requests_total{delivery=%q} = %v, want %v", tc.label, label, got, want)
			}
		}
	}
}
