package store

// Outcome is the answer of the grant check (PROTOCOL.md §4).
type Outcome int

const (
	// Granted: a live publication matches.
	Granted Outcome = iota
	// Forbidden: no publication matches the token's scope digest and
	// audience (403 sync.forbidden).
	Forbidden
	// NotFound: no record, or every match was fenced out by the partition
	// registry (404 sync.not_found).
	NotFound
	// Expired: every remaining match has expired (404 sync.segment_expired).
	Expired
)

func (o Outcome) String() string {
	switch o {
	case Granted:
		return "granted"
	case Forbidden:
		return "forbidden"
	case NotFound:
		return "not_found"
	case Expired:
		return "expired"
	}
	return "unknown"
}

// Grant applies §4 steps 2–5 to rec for a verified token's scope digest sd
// and audience aud at nowMs. audience derives a partition's audience.
// When granted, untilMs is the latest expiresAtMs among live matches.
func Grant(rec *Record, sd, aud string, audience func(partition string) string, nowMs int64) (out Outcome, untilMs int64) {
	if rec == nil {
		return NotFound, 0
	}
	matched := false
	fencedOut := true
	for i := range rec.Publications {
		p := &rec.Publications[i]
		if p.ScopeDigest != sd || audience(p.Partition) != aud {
			continue
		}
		matched = true
		if rec.Fenced {
			cur, ok := rec.Epochs[p.Partition]
			if !ok || cur != p.LogEpoch {
				continue
			}
		}
		fencedOut = false
		if p.ExpiresAtMs > nowMs && p.ExpiresAtMs > untilMs {
			untilMs = p.ExpiresAtMs
		}
	}
	switch {
	case !matched:
		return Forbidden, 0
	case fencedOut:
		return NotFound, 0
	case untilMs > nowMs:
		return Granted, untilMs
	default:
		return Expired, 0
	}
}
