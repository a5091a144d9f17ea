package store

// Outcome is the answer of the grant check (protocol §4).
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
	// Expired: every remaining match has expired or was overtaken by a
	// backfill checkpoint (404 sync.segment_expired).
	Expired
)

// String names the outcome as logged: granted, forbidden, not_found, expired.
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

// Reason says why Grant refused: which §4 step ruled the request out.
type Reason int

const (
	// ReasonNone: granted.
	ReasonNone Reason = iota
	// ReasonNoRecord: the store has no record of the segment (step 1).
	ReasonNoRecord
	// ReasonScope: no publication carries the token's scope digest
	// (step 2). Checked before the audience, as the reference does.
	ReasonScope
	// ReasonAudience: publications carry the scope digest, but none of
	// them is in a partition whose audience is the token's (step 2).
	ReasonAudience
	// ReasonFenced: every match is from another log epoch than its
	// partition's current one, or from a partition the registry does
	// not list (step 3).
	ReasonFenced
	// ReasonExpired: every remaining match has expired (step 5).
	ReasonExpired
	// ReasonOvertaken: a remaining match is live, but every live one was
	// overtaken by a backfill checkpoint of its partition (step 5).
	ReasonOvertaken
)

// String names the reason as logged (no_record, scope_digest, ...).
func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonNoRecord:
		return "no_record"
	case ReasonScope:
		return "scope_digest"
	case ReasonAudience:
		return "audience"
	case ReasonFenced:
		return "fenced"
	case ReasonExpired:
		return "expired"
	case ReasonOvertaken:
		return "overtaken"
	}
	return "unknown"
}

// GrantResult is the answer of Grant.
type GrantResult struct {
	// Outcome is the answer: Granted, Forbidden or Expired.
	Outcome Outcome
	Reason  Reason // ReasonNone when granted
	// UntilMs is the latest expiresAtMs among the live, un-overtaken
	// matches when granted; 0 otherwise.
	UntilMs int64
}

// Grant applies §4 steps 1–5 to rec (nil: no record) for a verified
// token's scope digest sd and audience aud at nowMs. audience derives a
// partition's audience. A publication is live while expiresAtMs > nowMs.
func Grant(rec *Record, sd, aud string, audience func(partition string) string, nowMs int64) GrantResult {
	if rec == nil {
		return GrantResult{Outcome: NotFound, Reason: ReasonNoRecord}
	}
	var (
		digestSeen bool // some publication carries sd
		matched    bool // some publication carries sd and aud
		fencedOut  = true
		overtaken  bool // some live match was overtaken
		live       bool // some live match was not overtaken
		untilMs    int64
	)
	for i := range rec.Publications {
		p := &rec.Publications[i]
		if p.ScopeDigest != sd {
			continue
		}
		digestSeen = true
		if audience(p.Partition) != aud {
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
		if p.ExpiresAtMs <= nowMs {
			continue
		}
		if v, ok := rec.Checkpoints[p.Partition]; ok && v > p.SchemaVersion {
			overtaken = true
			continue
		}
		if !live || p.ExpiresAtMs > untilMs {
			live, untilMs = true, p.ExpiresAtMs
		}
	}
	switch {
	case !digestSeen:
		return GrantResult{Outcome: Forbidden, Reason: ReasonScope}
	case !matched:
		return GrantResult{Outcome: Forbidden, Reason: ReasonAudience}
	case fencedOut:
		return GrantResult{Outcome: NotFound, Reason: ReasonFenced}
	case live:
		return GrantResult{Outcome: Granted, UntilMs: untilMs}
	case overtaken:
		return GrantResult{Outcome: Expired, Reason: ReasonOvertaken}
	default:
		return GrantResult{Outcome: Expired, Reason: ReasonExpired}
	}
}
