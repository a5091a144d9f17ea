package caddymodule

import (
	"context"

	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/internal/version"
	"github.com/syncular/caddy-syncular/store/s3"
)

// Notes at provision that are not errors: what a running edge cannot
// show afterwards, said once when the config loads. (Secrets and
// thresholds are warned about in guardrails.go.)

// moduleVersion is this module's version as the build stamped it
// (internal/version; make caddy stamps scripts/version.sh's answer).
func moduleVersion() string { return version.Get() }

// notePrefix warns when the S3 store's prefix holds no segment object:
// a prefix that differs from the sync server's (the docs and examples
// use syncular/) passes the start-up check, then answers every segment
// 404. An empty bucket before the first publication looks the same, so
// it is a warning. A listing the credentials may not make (no
// s3:ListBucket) says nothing.
func (h *Handler) notePrefix(ctx context.Context, s *s3.Store) {
	ok, err := s.HasSegments(ctx)
	if err != nil {
		h.logger.Debug("s3 store: could not list the prefix to check it holds segments", zap.Error(err))
		return
	}
	if ok {
		return
	}
	hint := "check that prefix is the one the sync server writes under"
	if s.Prefix() == "" {
		hint = "prefix is empty; the reference sync server and these docs write under a prefix such as syncular/: set the same one"
	}
	h.logger.Warn("s3 store: no segment objects under the prefix (every segment answers 404 until there are); "+hint,
		zap.String("bucket", s.Bucket()), zap.String("prefix", s.Prefix()), zap.String("listed", s.Prefix()+"seg/"))
}

// logProvisioned records the module's version at debug level, and
// whether the build stamped it (else it is the build information's).
func (h *Handler) logProvisioned() {
	if h.inspecting {
		return
	}
	h.logger.Debug("provisioned", zap.String("version", moduleVersion()), zap.Bool("version_stamped", version.Version != ""))
}
