package segid

import (
	"crypto/sha256"
	"encoding"
	"errors"
	"fmt"
	"hash"
	"io"
)

// The bytes of a body that is not the segment's, as Reader finds them.
// Each matches ErrMismatch.
var (
	ErrMismatch = errors.New("segid: the bytes are not the segment's")
	ErrShort    = fmt.Errorf("%w: the body ended before the segment's length", ErrMismatch)
	ErrLong     = fmt.Errorf("%w: the body is longer than the segment's length", ErrMismatch)
	ErrHash     = fmt.Errorf("%w: the body hashes to another id", ErrMismatch)
)

// Hasher hashes what is written to it, for a check against a segment id
// (Matches). Its zero value is ready to use. It never returns an error.
type Hasher struct{ h hash.Hash }

func (h *Hasher) init() {
	if h.h == nil {
		h.h = sha256.New()
	}
}

// Write hashes p.
func (h *Hasher) Write(p []byte) (int, error) {
	h.init()
	return h.h.Write(p)
}

// Sum is the digest of the bytes written so far.
func (h *Hasher) Sum() Digest {
	h.init()
	var d Digest
	h.h.Sum(d[:0])
	return d
}

// Matches reports whether the bytes written so far hash to d.
func (h *Hasher) Matches(d Digest) bool { return h.Sum() == d }

// Reset forgets the bytes written.
func (h *Hasher) Reset() {
	if h.h != nil {
		h.h.Reset()
	}
}

// MarshalBinary is the hash's state, so that hashing can go on in another
// Hasher (UnmarshalBinary).
func (h *Hasher) MarshalBinary() ([]byte, error) {
	h.init()
	return h.h.(encoding.BinaryMarshaler).MarshalBinary()
}

// UnmarshalBinary restores a state from MarshalBinary.
func (h *Hasher) UnmarshalBinary(state []byte) error {
	h.init()
	return h.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(state)
}

// Reader reads a segment's whole body and checks it: exactly size bytes
// that hash to the id. The bytes pass through as they arrive except those
// that end the body: the Read that would return the last byte first checks
// that the source has no byte more and that the whole hashed to the id,
// and returns, in place of those bytes, ErrLong or ErrHash when it did not;
// a body that ends early is ErrShort. So a response copied from a Reader
// can be aborted before the client holds every byte it was promised. The
// zero ID never verifies (ErrHash).
//
// Once the body ended (Err is not nil) every Read returns Err. Another
// error of the source is returned as it is, once.
type Reader struct {
	r       io.Reader
	want    Digest
	wantOK  bool
	size, n int64
	h       Hasher
	err     error
}

// NewReader returns a Reader of the size-byte body of segment id from r.
func NewReader(r io.Reader, id ID, size int64) *Reader {
	v := new(Reader)
	v.Reset(r, id, size)
	return v
}

// Reset makes v read the size-byte body of segment id from r, as
// NewReader does, reusing v's hash.
func (v *Reader) Reset(r io.Reader, id ID, size int64) {
	h := v.h
	h.Reset()
	*v = Reader{r: r, want: id.Digest(), wantOK: !id.IsZero(), size: size, h: h}
}

// Read reads the body; see Reader.
func (v *Reader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if v.n == v.size {
		v.err = v.check()
		return 0, v.err
	}
	if rem := v.size - v.n; int64(len(p)) > rem {
		p = p[:rem]
	}
	m, err := v.r.Read(p)
	v.h.Write(p[:m])
	v.n += int64(m)
	if v.n == v.size {
		// These bytes end the body: deliver them only when it checks.
		if v.err = v.check(); v.err != io.EOF {
			return 0, v.err
		}
		return m, nil // io.EOF on the next call
	}
	if err == io.EOF {
		v.err = ErrShort
		return 0, v.err
	}
	return m, err
}

// check looks for a byte past the body and compares the hash: io.EOF
// when the body is the segment's.
func (v *Reader) check() error {
	var extra [1]byte
	for range 3 { // a reader may return 0, nil; bounded
		k, err := v.r.Read(extra[:])
		if k > 0 {
			return ErrLong
		}
		if err != nil {
			// io.EOF, or a failure after every byte arrived: the probe
			// only looks for bytes past the body's length.
			break
		}
	}
	if !v.wantOK || !v.h.Matches(v.want) {
		return ErrHash
	}
	return io.EOF
}

// Err is how the body ended: nil while it has not, io.EOF when every byte
// was read and checked, or ErrShort, ErrLong, ErrHash.
func (v *Reader) Err() error { return v.err }

// N is the number of the body's bytes read from the source so far.
func (v *Reader) N() int64 { return v.n }
