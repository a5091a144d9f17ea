package caddymodule

import (
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/syncular/caddy-syncular/store"
)

func init() {
	caddy.RegisterModule(HealthHandler{})
	httpcaddyfile.RegisterHandlerDirective("syncular_health", parseHealthCaddyfile)
	// A terminal handler like respond: before it, so a site's
	// `syncular_health /healthz` answers before its catch-all respond.
	httpcaddyfile.RegisterDirectiveOrder("syncular_health", httpcaddyfile.Before, "respond")
}

// DefaultHealthGrace is how long a store's breaker may stay open before
// syncular_health answers 503 when grace is unset.
const DefaultHealthGrace = caddy.Duration(10 * time.Second)

// HealthHandler answers a health check for load balancers and operators
// from the segment stores of the syncular_segments handlers in this
// process: 200 while every store answers, 503 once a store's breaker
// has been open longer than Grace (the edge then answers requests for
// bytes it does not hold 503). The body is a small JSON object: the
// status, each store's backend and breaker state, each disk tier's
// usability. A disk tier that turned itself off does not make the edge
// unhealthy (it serves from the store); it is reported.
//
// Module ID: http.handlers.syncular_health.
type HealthHandler struct {
	// Grace is how long a store's breaker may be open before the answer
	// turns 503, so that a store blip the breaker rides out does not take
	// the edge out of rotation. Default: 10s; 0 turns 503 at once.
	Grace *caddy.Duration `json:"grace,omitempty"`

	grace time.Duration
	now   func() time.Time
}

// CaddyModule returns the Caddy module information.
func (HealthHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.syncular_health",
		New: func() caddy.Module { return new(HealthHandler) },
	}
}

// Provision resolves the defaults.
func (hh *HealthHandler) Provision(caddy.Context) error {
	hh.grace = time.Duration(DefaultHealthGrace)
	if hh.Grace != nil {
		hh.grace = time.Duration(*hh.Grace)
	}
	if hh.now == nil {
		hh.now = time.Now
	}
	return nil
}

// Validate rejects a negative grace.
func (hh *HealthHandler) Validate() error {
	if hh.grace < 0 {
		return errHealthGrace
	}
	return nil
}

var errHealthGrace = errors.New("grace must not be negative")

// healthReport is the JSON body of the answer.
type healthReport struct {
	Status string        `json:"status"` // "ok" or "unhealthy"
	Stores []healthStore `json:"stores"`
	Disks  []healthDisk  `json:"disk_tiers"`
}

type healthStore struct {
	Backend     string  `json:"backend"`
	Breaker     string  `json:"breaker"` // "closed" or "open"
	OpenSeconds float64 `json:"open_seconds,omitempty"`
}

type healthDisk struct {
	Usable bool `json:"usable"`
}

// ServeHTTP writes the report; it never calls next.
func (hh *HealthHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	rep := healthOf(hh.now(), hh.grace)
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Cache-Control", "no-store")
	status := http.StatusOK
	if rep.Status != "ok" {
		status = http.StatusServiceUnavailable
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		return json.NewEncoder(w).Encode(rep)
	}
	return nil
}

// healthOf reports the live stores and disk tiers at now.
func healthOf(now time.Time, grace time.Duration) healthReport {
	rep := healthReport{Status: "ok", Stores: []healthStore{}, Disks: []healthDisk{}}
	healthSet.mu.Lock()
	defer healthSet.mu.Unlock()
	seenStore := map[breakerReporter]bool{}
	seenDisk := map[*store.DiskTier]bool{}
	for _, m := range healthSet.m {
		if m.store != nil && !seenStore[m.store] {
			seenStore[m.store] = true
			hs := healthStore{Backend: m.backend, Breaker: "closed"}
			if since, open := m.store.BreakerOpenSince(); open {
				hs.Breaker = "open"
				d := now.Sub(since)
				hs.OpenSeconds = d.Round(time.Millisecond).Seconds()
				if d >= grace {
					rep.Status = "unhealthy"
				}
			}
			rep.Stores = append(rep.Stores, hs)
		}
		if m.disk != nil && !seenDisk[m.disk] {
			seenDisk[m.disk] = true
			rep.Disks = append(rep.Disks, healthDisk{Usable: m.disk.Stats().Usable})
		}
	}
	return rep
}

// breakerReporter is a store with a breaker (store.Cached).
type breakerReporter interface {
	BreakerOpenSince() (time.Time, bool)
}

// healthSet holds the live handlers' stores and disk tiers: a handler
// joins at Provision and leaves at Cleanup (metrics enabled or not).
var healthSet struct {
	mu sync.Mutex
	m  map[*Handler]healthMember
}

type healthMember struct {
	backend string
	store   breakerReporter
	disk    *store.DiskTier
}

// joinHealth reports h's store and disk tier to syncular_health.
func (h *Handler) joinHealth() {
	m := healthMember{disk: h.disk}
	if h.Store != nil {
		m.backend = h.Store.Backend
	}
	if h.store != nil { // a nil *store.Cached would make a non-nil interface
		m.store = h.store
	}
	healthSet.mu.Lock()
	defer healthSet.mu.Unlock()
	if healthSet.m == nil {
		healthSet.m = map[*Handler]healthMember{}
	}
	healthSet.m[h] = m
}

// leaveHealth stops reporting h's store and disk tier.
func (h *Handler) leaveHealth() {
	healthSet.mu.Lock()
	defer healthSet.mu.Unlock()
	delete(healthSet.m, h)
}

func parseHealthCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	hh := new(HealthHandler)
	err := hh.UnmarshalCaddyfile(h.Dispenser)
	return hh, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	syncular_health [<matcher>] {
//	    grace <duration>   # default 10s: how long a store's breaker may be open before 503
//	}
func (hh *HealthHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "grace":
			if hh.Grace != nil {
				return d.Errf("grace given twice")
			}
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("grace: %v", err)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			g := caddy.Duration(dur)
			hh.Grace = &g
		default:
			return d.Errf("unknown subdirective %q", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*HealthHandler)(nil)
	_ caddy.Validator             = (*HealthHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*HealthHandler)(nil)
	_ caddyfile.Unmarshaler       = (*HealthHandler)(nil)
	_ breakerReporter             = (*store.Cached)(nil)
)
