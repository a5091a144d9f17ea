package disk

import "os"

// Large page cache pages for what sendfile(2) sends.
//
// A fill writes what its source hands it: an S3 body or a blob copy
// arrives in writes of 32 KiB or less, and the kernel builds a file's page
// cache in pages (folios) no larger than the write that created them.
// Sending a file cached in 32 KiB folios costs more than one cached in
// large ones: each packet refers to more, smaller pages. nginx itself
// spends more server CPU per answer on a file written in 32 KiB writes
// than on one written in 256 KiB or larger writes (or in one, which makes
// 2 MiB folios on ext4) (docs/performance.md, "Raw sendfile calls and
// large page cache folios"). So a fill writes
// zeros ahead of its data, one aligned prefillChunk at a time, and the
// data overwrites them in the pages those writes made: 2 MiB folios, as
// a file written in one piece gets. It costs one more memory copy per
// byte, once per fill; the readers, who read only what the fill published
// (written), never see the zeros, and the file is exactly the segment's
// size when the data is all there.
const prefillChunk = 2 << 20

var zeros [prefillChunk]byte

// prefillWriter appends to a file and writes zeros ahead of the data
// (see above), up to a limit: the segment's size for a fill, or a bound
// for a variant, whose size is not known beforehand and whose file trim
// cuts to n when the writes are done.
type prefillWriter struct {
	file  *os.File
	n     int64 // bytes written
	pre   int64 // the file's bytes up to here exist (zeros past the data)
	limit int64 // the prefill never goes past this size
}

func newPrefillWriter(f *os.File, limit int64) prefillWriter {
	return prefillWriter{file: f, limit: limit}
}

func (w *prefillWriter) Write(p []byte) (int, error) {
	w.ahead(w.n + int64(len(p)))
	n, err := w.file.Write(p)
	w.n += int64(n)
	return n, err
}

// ahead makes the file's bytes exist up to the prefillChunk boundary at
// or past end (at most the limit). It is best effort: a write that fails
// (a disk with less room than the step) ends the prefill for this file,
// and the data's own writes meet the failure, if any, where they would
// have without it (a fill hands its readers over once bytes are there).
func (w *prefillWriter) ahead(end int64) {
	for w.pre < end && w.pre < w.limit {
		k := min(prefillChunk-w.pre%prefillChunk, w.limit-w.pre)
		if _, err := w.file.WriteAt(zeros[:k], w.pre); err != nil {
			w.limit = w.pre
			return
		}
		w.pre += k
	}
}

// trim cuts the file to the bytes written: the zeros past them go.
func (w *prefillWriter) trim() error {
	if err := w.file.Truncate(w.n); err != nil {
		return unavailable(err)
	}
	return nil
}
