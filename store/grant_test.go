package store_test

import (
	"testing"

	"github.com/syncular/caddy-syncular/store"
)

const (
	grantNow = int64(1_750_000_000_000)
	sdA      = "digest-a"
	sdB      = "digest-b"
)

func grantAud(partition string) string { return "aud:" + partition }

// gpub is a publication of partition under sd at schema version sv,
// epoch e1, expiring at exp.
func gpub(partition, sd string, sv, exp int64) store.Publication {
	return store.Publication{Partition: partition, LogEpoch: "e1", Table: "tasks", SchemaVersion: sv,
		MediaType: store.MediaRows, ScopeDigest: sd, ExpiresAtMs: exp}
}

func TestGrantSteps(t *testing.T) {
	live, later := grantNow+60_000, grantNow+120_000
	cases := []struct {
		name    string
		rec     *store.Record
		sd, aud string
		want    store.GrantResult
	}{
		{"no record", nil, sdA, "aud:p1",
			store.GrantResult{Outcome: store.NotFound, Reason: store.ReasonNoRecord}},
		{"granted", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Granted, UntilMs: live}},
		{"unknown digest", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)}}, sdB, "aud:p1",
			store.GrantResult{Outcome: store.Forbidden, Reason: store.ReasonScope}},
		// Scope digest before audience: neither matches, the digest is named.
		{"unknown digest and audience", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)}}, sdB, "aud:p9",
			store.GrantResult{Outcome: store.Forbidden, Reason: store.ReasonScope}},
		// sdB is published (in p2), so the audience is what fails, even
		// though p1's audience is the token's.
		{"digest of another partition", &store.Record{Publications: []store.Publication{
			gpub("p1", sdA, 1, live), gpub("p2", sdB, 1, live)}}, sdB, "aud:p1",
			store.GrantResult{Outcome: store.Forbidden, Reason: store.ReasonAudience}},
		{"audience mismatch", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)}}, sdA, "aud:p2",
			store.GrantResult{Outcome: store.Forbidden, Reason: store.ReasonAudience}},
		{"empty publication list", &store.Record{Publications: []store.Publication{}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Forbidden, Reason: store.ReasonScope}},
		{"epoch rotated", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)},
			Fenced: true, Epochs: map[string]string{"p1": "e2"}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.NotFound, Reason: store.ReasonFenced}},
		{"partition not registered", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)},
			Fenced: true, Epochs: map[string]string{}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.NotFound, Reason: store.ReasonFenced}},
		{"current epoch", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)},
			Fenced: true, Epochs: map[string]string{"p1": "e1"}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Granted, UntilMs: live}},
		// Fencing comes before expiry and checkpoints.
		{"fenced and overtaken", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)},
			Fenced: true, Epochs: map[string]string{"p1": "e2"}, Checkpoints: map[string]int64{"p1": 2}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.NotFound, Reason: store.ReasonFenced}},
		{"expired", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, grantNow-1)}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Expired, Reason: store.ReasonExpired}},
		{"overtaken", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)},
			Checkpoints: map[string]int64{"p1": 2}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Expired, Reason: store.ReasonOvertaken}},
		{"checkpoint at the same schema version", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 2, live)},
			Checkpoints: map[string]int64{"p1": 2}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Granted, UntilMs: live}},
		{"checkpoint of another partition", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, live)},
			Checkpoints: map[string]int64{"p2": 9}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Granted, UntilMs: live}},
		{"expired and overtaken", &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, grantNow)},
			Checkpoints: map[string]int64{"p1": 2}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Expired, Reason: store.ReasonExpired}},
		// A live overtaken one next to an expired current one: the live
		// one is why the request fails now.
		{"overtaken next to expired", &store.Record{Publications: []store.Publication{
			gpub("p1", sdA, 3, grantNow-1), gpub("p1", sdA, 1, live)},
			Checkpoints: map[string]int64{"p1": 2}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Expired, Reason: store.ReasonOvertaken}},
		// The overtaken publication's later expiry does not extend the grant.
		{"overtaken next to current", &store.Record{Publications: []store.Publication{
			gpub("p1", sdA, 1, later), gpub("p1", sdA, 3, live)},
			Checkpoints: map[string]int64{"p1": 2}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Granted, UntilMs: live}},
		{"latest live expiry", &store.Record{Publications: []store.Publication{
			gpub("p1", sdA, 1, live), gpub("p1", sdA, 1, later), gpub("p1", sdA, 1, grantNow-5)}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Granted, UntilMs: later}},
		{"another partition's later expiry", &store.Record{Publications: []store.Publication{
			gpub("p1", sdA, 1, live), gpub("p2", sdA, 1, later)}}, sdA, "aud:p1",
			store.GrantResult{Outcome: store.Granted, UntilMs: live}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := store.Grant(c.rec, c.sd, c.aud, grantAud, grantNow); got != c.want {
				t.Errorf("Grant = %+v (%v, %v), want %+v (%v, %v)", got, got.Outcome, got.Reason, c.want, c.want.Outcome, c.want.Reason)
			}
		})
	}
}

// TestGrantExpiryBoundary: live means expiresAtMs > now, to the
// millisecond, whether the publication is alone or next to a live one
// that the token does not match or that expires later.
func TestGrantExpiryBoundary(t *testing.T) {
	const exp = grantNow + 5_000
	other := map[string]store.Publication{
		"alone":                         {},
		"next to another partition":     gpub("p2", sdA, 1, exp+3_600_000),
		"next to another scope digest":  gpub("p1", sdB, 1, exp+3_600_000),
		"next to one that expires soon": gpub("p1", sdB, 1, exp+1),
	}
	for name, o := range other {
		pubs := []store.Publication{gpub("p1", sdA, 1, exp)}
		if o.Partition != "" {
			pubs = append(pubs, o)
		}
		rec := &store.Record{Publications: pubs}
		for _, c := range []struct {
			now  int64
			want store.GrantResult
		}{
			{exp - 1, store.GrantResult{Outcome: store.Granted, UntilMs: exp}},
			{exp, store.GrantResult{Outcome: store.Expired, Reason: store.ReasonExpired}},
			{exp + 1, store.GrantResult{Outcome: store.Expired, Reason: store.ReasonExpired}},
		} {
			if got := store.Grant(rec, sdA, "aud:p1", grantAud, c.now); got != c.want {
				t.Errorf("%s, now = expiresAtMs%+d: Grant = %+v, want %+v", name, c.now-exp, got, c.want)
			}
		}
	}
	// Next to a live publication the token does match: the grant moves to
	// it at the boundary and never ends at a passed expiry.
	rec := &store.Record{Publications: []store.Publication{gpub("p1", sdA, 1, exp), gpub("p1", sdA, 1, exp+1)}}
	for _, c := range []struct {
		now  int64
		want store.GrantResult
	}{
		{exp - 1, store.GrantResult{Outcome: store.Granted, UntilMs: exp + 1}},
		{exp, store.GrantResult{Outcome: store.Granted, UntilMs: exp + 1}},
		{exp + 1, store.GrantResult{Outcome: store.Expired, Reason: store.ReasonExpired}},
	} {
		if got := store.Grant(rec, sdA, "aud:p1", grantAud, c.now); got != c.want {
			t.Errorf("two matches, now = expiresAtMs%+d: Grant = %+v, want %+v", c.now-exp, got, c.want)
		}
	}
}
