package store

import "github.com/syncular/caddy-syncular/compress"

// SetVariantFaultForTest makes every variant c builds pass through f
// after encoding and before verification, so a test can corrupt it.
func SetVariantFaultForTest(c *Cached, f func(compress.Coding, []byte)) { c.vt.corrupt = f }
