package segid

import "strings"

// The S3 layout (protocol §5.2): under a key prefix (empty, or e.g.
// "syncular/"), the bytes of a segment at {prefix}seg/sha256/{hex} and
// its record object at {prefix}rec/sha256/{hex}.json: the id with its
// first ":" replaced by "/".

// ObjectKey is the key of the bytes of segment id under prefix.
func ObjectKey(prefix, id string) string {
	if Valid(id) {
		return prefix + "seg/sha256/" + id[len(Prefix):]
	}
	return prefix + "seg/" + strings.Replace(id, ":", "/", 1)
}

// RecordKey is the key of the record object of segment id under prefix.
func RecordKey(prefix, id string) string {
	if Valid(id) {
		return prefix + "rec/sha256/" + id[len(Prefix):] + ".json"
	}
	return prefix + "rec/" + strings.Replace(id, ":", "/", 1) + ".json"
}
