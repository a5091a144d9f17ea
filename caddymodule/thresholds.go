package caddymodule

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Warning thresholds of the duration and size settings that skew and
// record_ttl (guardrails.go) did not cover. Each warning names the setting,
// its value and the reason; none of these settings is a secret.
//
// Reviewed and left without a threshold: store_queue_wait (warned about
// when not below store_timeout, which bounds it), cache max_entry (warned
// about when above max_bytes), cache max_records (a record is a few
// hundred bytes: a million of them is well under max_bytes' worth),
// store_concurrency and store_queue (counts whose cost is the store's
// and a waiting request's, bounded by store_queue_wait), cache
// disk_max_bytes (the disk tier stops filling when its filesystem is full
// and the directory may not exist at provision, so no size to compare).
const (
	// warnGrace: a revocation written during a store outage reaches the
	// edge when the store answers again or grace after the last good
	// read. skew and record_ttl, which delay revocations the same way,
	// are warned about in minutes; an outage worth riding out is hours.
	warnGrace = time.Hour
	// warnPresignTTL: a presigned URL cannot be revoked; a leaked one
	// fetches the object until it expires.
	warnPresignTTL = time.Hour
	// warnStoreTimeout: a request waits this long on a store that does
	// not answer, holding its connection and a store slot.
	warnStoreTimeout = time.Minute
	// warnMaxTokenLength: a token is a few hundred bytes; the edge reads
	// up to this many per request before any crypto.
	warnMaxTokenLength = 64 << 10
)

// memTotal is the machine's memory in bytes, 0 when unknown; a variable
// for tests.
var memTotal = readMemTotal

// readMemTotal reads MemTotal from /proc/meminfo (Linux); 0 elsewhere or
// on any error.
func readMemTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || kb <= 0 || kb > 1<<53/1024 {
			return 0
		}
		return kb << 10
	}
	return 0
}

// thresholdWarnings warns about durations and sizes far beyond what the
// edge needs, with defaults applied (setDefaults ran).
func (h *Handler) thresholdWarnings() []string {
	var w []string
	if h.grace > warnGrace {
		w = append(w, fmt.Sprintf("syncular_segments: grace %v is above %v: a revocation (a fence, a removed publication) written during "+
			"a store outage reaches the edge only when the store answers again or that long after the last successful read; keep "+
			"grace to the outage you mean to ride out, in minutes (default %v)", h.grace, warnGrace, defaultGrace))
	}
	if h.Delivery == DeliveryRedirect {
		if ttl := time.Duration(h.PresignTTL); ttl > warnPresignTTL {
			w = append(w, fmt.Sprintf("syncular_segments: presign_ttl %v is above %v: a presigned URL cannot be revoked, so a leaked one "+
				"fetches the object until it expires (or the token does), whatever grant is revoked meanwhile; a client follows "+
				"the redirect at once, so seconds are enough (default %v)", ttl, warnPresignTTL, defaultPresignTTL))
		}
	}
	if st := time.Duration(h.StoreTimeout); st > warnStoreTimeout {
		w = append(w, fmt.Sprintf("syncular_segments: store_timeout %v is above %v: a request waits that long on a store that does "+
			"not answer before its 504, holding its connection and a store slot, so a hung store piles up requests; keep it "+
			"to seconds (default %v)", st, warnStoreTimeout, defaultStoreTimeout))
	}
	if h.MaxTokenLength > warnMaxTokenLength {
		w = append(w, fmt.Sprintf("syncular_segments: max_token_length %d is above %d: the edge reads and decodes up to that many bytes "+
			"of every request's token before any crypto, and real tokens are a few hundred bytes; keep the default (%d)",
			h.MaxTokenLength, warnMaxTokenLength, defaultMaxTokenLength))
	}
	if mem := memTotal(); mem > 0 && h.cacheOpts.MaxBytes > mem {
		w = append(w, fmt.Sprintf("syncular_segments: cache max_bytes %s is above this machine's memory (MemTotal %s): the memory "+
			"cache would grow until the kernel kills Caddy; keep it to a fraction of memory and use the disk tier for more "+
			"(docs/large-segments.md)", iBytes(h.cacheOpts.MaxBytes), iBytes(mem)))
	}
	return w
}
