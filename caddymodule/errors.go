package caddymodule

import (
	"net/http"
	"strconv"
)

// protoError is one answer of the error catalog (protocol §6). The
// code fixes status, category, retryable and recommendedAction.
type protoError struct {
	status    int
	code      string
	category  string
	retryable bool
	action    string
}

var (
	errForbidden    = protoError{http.StatusForbidden, "sync.forbidden", "forbidden", false, "checkPermissions"}
	errNotFound     = protoError{http.StatusNotFound, "sync.not_found", "not-found", false, "forceResync"}
	errExpired      = protoError{http.StatusNotFound, "sync.segment_expired", "not-found", true, "retryLater"}
	errInvalid      = protoError{http.StatusBadRequest, "sync.invalid_request", "invalid-request", false, "fixRequest"}
	errMethod       = protoError{http.StatusMethodNotAllowed, "edge.method_not_allowed", "invalid-request", false, "fixRequest"}
	errRange        = protoError{http.StatusRequestedRangeNotSatisfiable, "edge.range_not_satisfiable", "invalid-request", false, "fixRequest"}
	errStoreDown    = protoError{http.StatusServiceUnavailable, "edge.store_unavailable", "internal", true, "retryLater"}
	errStoreTimeout = protoError{http.StatusGatewayTimeout, "edge.store_timeout", "internal", true, "retryLater"}
)

// write sends the JSON error body. message is fixed text chosen by the
// handler: it never carries a partition id, a key or a token.
func (e protoError) write(w http.ResponseWriter, message string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if e.retryable && e.status >= 500 && h.Get("Retry-After") == "" {
		h.Set("Retry-After", "1")
	}
	body := make([]byte, 0, 192)
	body = append(body, `{"code":`...)
	body = strconv.AppendQuote(body, e.code)
	body = append(body, `,"category":`...)
	body = strconv.AppendQuote(body, e.category)
	body = append(body, `,"retryable":`...)
	body = strconv.AppendBool(body, e.retryable)
	body = append(body, `,"recommendedAction":`...)
	body = strconv.AppendQuote(body, e.action)
	body = append(body, `,"message":`...)
	body = strconv.AppendQuote(body, message)
	body = append(body, "}\n"...)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.status)
	_, _ = w.Write(body)
}
