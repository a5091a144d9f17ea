package caddymodule

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// cacheSubdirectives are the lines of the cache block, for didYouMean.
var cacheSubdirectives = []string{"disk", "disk_best_effort", "disk_max_bytes", "max_bytes", "max_entry", "max_records", "record_ttl"}

// parseCache parses the cache block (syntax on UnmarshalCaddyfile).
func parseCache(h *Handler, disp *caddyfile.Dispenser) error {
	if disp.NextArg() {
		return disp.ArgErr()
	}
	c := &CacheConfig{}
	h.Cache = c
	return parseBlock(disp, disp.Nesting(), "cache: ", func(sub string) error {
		switch sub {
		case "disk", "disk_max_bytes":
			return parseDiskSub(disp, c, sub)
		case "disk_best_effort":
			if disp.NextArg() {
				return disp.ArgErr()
			}
			c.DiskBestEffort = true
		case "max_bytes", "max_entry":
			v, err := oneArg(disp)
			if err != nil {
				return err
			}
			n, err := humanize.ParseBytes(v)
			if err != nil || n > 1<<50 {
				return disp.Errf("cache: %s: bad size %q", sub, v)
			}
			size := int64(n)
			if sub == "max_bytes" {
				c.MaxBytes = &size
			} else {
				c.MaxEntry = &size
			}
		case "record_ttl":
			v, err := oneArg(disp)
			if err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur < 0 {
				return disp.Errf("cache: record_ttl: bad duration %q", v)
			}
			ttl := caddy.Duration(dur)
			c.RecordTTL = &ttl
		case "max_records":
			v, err := oneArg(disp)
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return disp.Errf("cache: max_records must be a number >= 0, not %q", v)
			}
			c.MaxRecords = &n
		default:
			return disp.Errf("cache: unknown subdirective %q%s", sub, didYouMean(sub, cacheSubdirectives))
		}
		return nil
	})
}

// parseDiskSub parses the disk tier's subdirectives of cache {}:
//
//	disk           <dir>|off  # default: <Caddy data dir>/syncular/segments; its own directory
//	disk_max_bytes <size>     # default 4GiB; 0 turns the disk tier off
func parseDiskSub(disp *caddyfile.Dispenser, c *CacheConfig, sub string) error {
	v, err := oneArg(disp)
	if err != nil {
		return err
	}
	switch sub {
	case "disk":
		c.Disk = v
	case "disk_max_bytes":
		n, err := humanize.ParseBytes(v)
		if err != nil || n > 1<<50 {
			return disp.Errf("cache: disk_max_bytes: bad size %q", v)
		}
		size := int64(n)
		c.DiskMaxBytes = &size
	}
	return nil
}
