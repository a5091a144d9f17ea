package caddymodule

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/store"
)

// codingsJSON and codingsText write a coding list as the field docs
// (["zstd", "gzip"]) and the Caddyfile syntax (zstd gzip) do.
func codingsJSON(cs []compress.Coding) string {
	q := make([]string, len(cs))
	for i, c := range cs {
		q[i] = strconv.Quote(c.String())
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func codingsText(cs []compress.Coding) string {
	q := make([]string, len(cs))
	for i, c := range cs {
		q[i] = c.String()
	}
	return strings.Join(q, " ")
}

// TestDocsStateDefaults: every default is stated with the value of its
// named constant, in the JSON field's doc (what Caddy's docs site shows)
// and in the Caddyfile syntax on UnmarshalCaddyfile, and every JSON field
// says what happens when it is absent (a default, or that it is required).
func TestDocsStateDefaults(t *testing.T) {
	secs := func(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) + "s" }
	mins := func(d time.Duration) string {
		if d%time.Minute != 0 {
			t.Fatalf("%v is not whole minutes", d)
		}
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	}
	iec := func(n int) string {
		if n%(1<<20) != 0 {
			t.Fatalf("%d is not whole MiB", n)
		}
		return strconv.Itoa(n>>20) + "MiB"
	}
	gib := func(n int64) string {
		if n%(1<<30) != 0 {
			t.Fatalf("%d is not whole GiB", n)
		}
		return strconv.FormatInt(n>>30, 10) + "GiB"
	}
	defaults := []struct {
		field, sub, json, caddyfile string
	}{
		{"Skew", "skew", secs(defaultSkew), secs(defaultSkew)},
		{"PresignTTL", "presign_ttl", secs(defaultPresignTTL), secs(defaultPresignTTL)},
		{"StoreTimeout", "store_timeout", secs(defaultStoreTimeout), secs(defaultStoreTimeout)},
		{"Grace", "grace", mins(defaultGrace), mins(defaultGrace)},
		{"StoreConcurrency", "store_concurrency", strconv.Itoa(defaultStoreConcurrency), strconv.Itoa(defaultStoreConcurrency)},
		{"StoreQueue", "store_queue", strconv.Itoa(defaultStoreQueue), strconv.Itoa(defaultStoreQueue)},
		{"StoreQueueWait", "store_queue_wait", secs(defaultStoreQueueWait), secs(defaultStoreQueueWait)},
		{"MaxTokenLength", "max_token_length", strconv.Itoa(defaultMaxTokenLength), strconv.Itoa(defaultMaxTokenLength)},
		{"Untokened", "untokened", strconv.Quote(defaultUntokened), defaultUntokened},
		{"LegacyHeaders", "legacy_headers", strconv.Quote(defaultLegacyHeaders), defaultLegacyHeaders},
		{"PathStyle", "path_style", strconv.FormatBool(defaultPathStyle), strconv.FormatBool(defaultPathStyle)},
		{"VerifyStoreOnStart", "verify_store_on_start", strconv.FormatBool(defaultVerifyStore), strconv.FormatBool(defaultVerifyStore)},
		{"MaxBytes", "max_bytes", strconv.Itoa(store.DefaultMaxBytes), iec(store.DefaultMaxBytes)},
		{"MaxEntry", "max_entry", strconv.Itoa(store.DefaultMaxEntry), iec(store.DefaultMaxEntry)},
		{"RecordTTL", "record_ttl", secs(store.DefaultRecordTTL), secs(store.DefaultRecordTTL)},
		{"MaxRecords", "max_records", strconv.Itoa(store.DefaultMaxRecords), strconv.Itoa(store.DefaultMaxRecords)},
		{"DiskMaxBytes", "disk_max_bytes", strconv.FormatInt(defaultDiskMaxBytes, 10), gib(defaultDiskMaxBytes)},
		{"Compress", "compress", codingsJSON(compress.DefaultPrefs()), codingsText(compress.DefaultPrefs())},
	}

	fset := gotoken.NewFileSet()
	fieldDocs := map[string]string{}
	var syntax string
	for _, file := range []string{"module.go", "store.go", "s3.go", "cache.go", "auth.go", "caddyfile.go"} {
		f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Name.Name == "UnmarshalCaddyfile" {
					syntax = n.Doc.Text()
				}
			case *ast.StructType:
				for _, fld := range n.Fields.List {
					if fld.Tag == nil || !strings.Contains(fld.Tag.Value, `json:"`) || len(fld.Names) != 1 {
						continue
					}
					doc := fld.Doc.Text()
					if !strings.Contains(doc, "Default") && !strings.Contains(doc, "Required") {
						t.Errorf("%s: field %s states neither its default nor that it is required", file, fld.Names[0].Name)
					}
					fieldDocs[fld.Names[0].Name] = doc
				}
			}
			return true
		})
	}
	for _, d := range defaults {
		doc := strings.Join(strings.Fields(fieldDocs[d.field]), " ")
		i := strings.Index(doc, "Default")
		if i < 0 || !strings.Contains(doc[i:], d.json) {
			t.Errorf("field %s: doc does not state the default %s: %q", d.field, d.json, doc)
		}
		found := false
		for _, line := range strings.Split(syntax, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == d.sub {
				found = true
				if !strings.Contains(line, "default "+d.caddyfile) {
					t.Errorf("Caddyfile syntax of %s does not state default %s: %q", d.sub, d.caddyfile, line)
				}
			}
		}
		if !found {
			t.Errorf("Caddyfile syntax lacks %s", d.sub)
		}
	}
}
