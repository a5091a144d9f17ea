package store

import (
	"context"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store/disk"
)

// Variants of large segments: a segment the bytes cache does not hold
// but whose length is known (from the record cache) has its variants in
// the disk tier (disk.Cache.Variant), built from its verified identity
// file or while that file is filled (a growing variant its requests
// follow), verified, and kept as files in the same budget. The body is the
// disk tier's reader, so a complete variant file goes out with
// sendfile(2) like an identity file.

// diskVariant is variant's step for the disk tier.
func (c *Cached) diskVariant(id segid.ID, coding compress.Coding) (*Body, int64, disk.VariantState) {
	d := c.opts.Disk
	if d == nil {
		return nil, 0, variantUnavailable
	}
	size, ok := c.records.size(id.String())
	if !ok {
		return nil, 0, variantUnavailable
	}
	h, st := d.Variant(id, size, coding)
	if st != variantReady && st != variantFollowing {
		return nil, 0, st
	}
	// A growing variant's reader waits for its encoder: under the
	// request's context once the caller binds it (BindContext), else
	// until the disk tier's fill timeout ends the build.
	t := TierDisk
	if h.Growing() {
		t = TierDiskFollow // a variant encoded as its segment is filled
	}
	b, err := diskBody(context.Background(), h, t, 0, -1, nil)
	if err != nil {
		h.Close()
		return nil, 0, variantUnavailable
	}
	c.diskReads.Add(1)
	return b, b.size, st
}

// variantStats adds the disk tier's variant counts to the memory tier's.
func (c *Cached) variantStats() VariantStats {
	s := c.vt.stats()
	if d := c.opts.Disk; d != nil {
		ds := d.Stats()
		s.Made += int64(ds.VariantsMade)
		s.Rejected += int64(ds.VariantsRejected)
		s.Incompressible += int64(ds.VariantsIncompressible)
	}
	return s
}

// bindContext makes a body that follows a growing variant stop waiting
// for more bytes when ctx ends (the request's context: a client that went
// away). Call it before the first Read; other bodies ignore it.
func bindContext(ctx context.Context, b *Body) {
	if b.h == nil || !b.h.Growing() {
		return
	}
	if r, err := b.h.Reader(ctx, 0, -1); err == nil {
		b.r = r
	}
}
