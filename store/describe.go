package store

// This file is read-only introspection for an operator's tool: what a
// store holds and in which layout, and the standing of each publication
// of a segment. Nothing here is on the request path. Its results name
// partition ids (the operator's own data); a caller that answers clients
// must not pass them on.

// Publication states, as Grant decides them for a token that matches the
// publication's scope digest and audience.
const (
	StateLive      = "live"
	StateExpired   = "expired"
	StateFenced    = "fenced"
	StateOvertaken = "overtaken"
)

// PublicationState is one publication of a record and its standing.
type PublicationState struct {
	Publication
	// State is StateLive, StateExpired, StateFenced or StateOvertaken.
	State string
	// With a partition registry (rec.Fenced): the partition's current
	// epoch, and whether the registry lists the partition at all.
	CurrentEpoch string
	Registered   bool
	// Checkpoint is the partition's highest backfill checkpoint
	// schema_version, when it has one.
	Checkpoint    int64
	HasCheckpoint bool
}

// PublicationStates gives each publication of rec its state at nowMs,
// decided by Grant itself: each publication alone in a record with rec's
// registry epochs and checkpoints, asked for with its own scope digest
// and its partition as the audience.
func PublicationStates(rec *Record, nowMs int64) []PublicationState {
	if rec == nil {
		return nil
	}
	identity := func(p string) string { return p }
	out := make([]PublicationState, 0, len(rec.Publications))
	for _, p := range rec.Publications {
		one := &Record{
			SegmentID:    rec.SegmentID,
			ByteLength:   rec.ByteLength,
			MediaType:    rec.MediaType,
			Publications: []Publication{p},
			Fenced:       rec.Fenced,
			Epochs:       rec.Epochs,
			Checkpoints:  rec.Checkpoints,
		}
		st := PublicationState{Publication: p}
		switch res := Grant(one, p.ScopeDigest, p.Partition, identity, nowMs); {
		case res.Outcome == Granted:
			st.State = StateLive
		case res.Reason == ReasonFenced:
			st.State = StateFenced
		case res.Reason == ReasonOvertaken:
			st.State = StateOvertaken
		default:
			st.State = StateExpired
		}
		if rec.Fenced {
			st.CurrentEpoch, st.Registered = rec.Epochs[p.Partition]
		}
		st.Checkpoint, st.HasCheckpoint = rec.Checkpoints[p.Partition]
		out = append(out, st)
	}
	return out
}
