package segid

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/iotest"
)

func body(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// readAll reads r to its end with a small buffer and returns what it
// delivered and the error that ended it.
func readAll(r io.Reader) ([]byte, error) {
	var out []byte
	buf := make([]byte, 100)
	for range 1 << 20 {
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out, err
		}
	}
	return out, errors.New("no end")
}

func TestReaderVerifies(t *testing.T) {
	for _, size := range []int{0, 1, 99, 100, 101, 1000} {
		b := body(size)
		id := Of(b).String()
		for name, src := range map[string]func() io.Reader{
			"whole":    func() io.Reader { return bytes.NewReader(b) },
			"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
			"data+EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
			"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(b)) },
		} {
			v := NewReader(src(), idOf(id), int64(size))
			got, err := readAll(v)
			if err != io.EOF || !bytes.Equal(got, b) {
				t.Errorf("size %d %s: read %d bytes, %v; want all %d and io.EOF", size, name, len(got), err, size)
			}
			if v.Err() != io.EOF || v.N() != int64(size) {
				t.Errorf("size %d %s: Err %v N %d", size, name, v.Err(), v.N())
			}
			if n, err := v.Read(make([]byte, 8)); n != 0 || err != io.EOF {
				t.Errorf("size %d %s: a Read past the end: %d, %v", size, name, n, err)
			}
		}
	}
}

// TestReaderRefuses: one flipped byte anywhere, a short or long body, a
// body for another id: the reader never delivers the body's last byte and
// ends with the error.
func TestReaderRefuses(t *testing.T) {
	const size = 1000
	b := body(size)
	id := Of(b).String()
	type tc struct {
		src  []byte
		id   string
		size int64
		want error
	}
	cases := map[string]tc{
		"short by one":   {b[:size-1], id, size, ErrShort},
		"empty":          {nil, id, size, ErrShort},
		"long by one":    {append(append([]byte(nil), b...), 0), id, size, ErrLong},
		"twice":          {append(append([]byte(nil), b...), b...), id, size, ErrLong},
		"other id":       {b, Of(b[1:]).String(), size, ErrHash},
		"uppercase id":   {b, "sha256:" + Of(b).Hex()[:63] + "F", size, ErrHash},
		"not an id":      {b, "sha512:" + Of(b).Hex(), size, ErrHash},
		"empty id":       {b, "", size, ErrHash},
		"empty, long":    {[]byte{1}, Of(nil).String(), 0, ErrLong},
		"empty, hash":    {nil, Of([]byte{1}).String(), 0, ErrHash},
		"prefix of body": {b, Of(b[:size-1]).String(), size - 1, ErrLong},
	}
	for _, at := range []int{0, 1, 99, 100, 500, size - 2, size - 1} {
		f := append([]byte(nil), b...)
		f[at] ^= 0x40
		cases[fmt.Sprintf("flipped byte @%d", at)] = tc{f, id, size, ErrHash}
	}
	for name, c := range cases {
		for _, one := range []bool{false, true} {
			var src io.Reader = bytes.NewReader(c.src)
			if one {
				src = iotest.OneByteReader(src)
			}
			v := NewReader(src, idOf(c.id), c.size)
			got, err := readAll(v)
			if !errors.Is(err, c.want) || !errors.Is(err, ErrMismatch) {
				t.Errorf("%s (one byte %v): ended with %v, want %v", name, one, err, c.want)
			}
			if v.Err() != err {
				t.Errorf("%s: Err() = %v, Read ended with %v", name, v.Err(), err)
			}
			if int64(len(got)) >= max(c.size, 1) {
				t.Errorf("%s (one byte %v): delivered %d bytes of %d before failing", name, one, len(got), c.size)
			}
			if _, again := v.Read(make([]byte, 8)); again != err {
				t.Errorf("%s: the failure is not sticky: %v", name, again)
			}
		}
	}
}

// errReader returns its bytes, then err.
type errReader struct {
	b   []byte
	err error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, r.err
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestReaderSourceError: a failure of the source mid-body is returned as
// it is, and is not taken for the body's end.
func TestReaderSourceError(t *testing.T) {
	b := body(300)
	boom := errors.New("boom")
	v := NewReader(&errReader{b: b[:150], err: boom}, idOf(Of(b).String()), 300)
	got, err := readAll(v)
	if err != boom || len(got) != 150 || v.Err() != nil {
		t.Fatalf("read %d, %v, Err %v; want 150 bytes and the source's error", len(got), err, v.Err())
	}
	// A failure after every byte arrived: the probe only looks for more.
	v = NewReader(&errReader{b: b, err: boom}, idOf(Of(b).String()), 300)
	if got, err := readAll(v); err != io.EOF || !bytes.Equal(got, b) {
		t.Fatalf("a source failing after the last byte: %d bytes, %v", len(got), err)
	}
}

func TestReaderReset(t *testing.T) {
	a, b := body(200), body(300)
	var v Reader
	v.Reset(bytes.NewReader(a[:100]), idOf(Of(a).String()), 200)
	if _, err := readAll(&v); !errors.Is(err, ErrShort) {
		t.Fatalf("first body: %v", err)
	}
	v.Reset(bytes.NewReader(b), idOf(Of(b).String()), 300)
	if got, err := readAll(&v); err != io.EOF || !bytes.Equal(got, b) {
		t.Fatalf("after Reset: %d bytes, %v (a hash carried over?)", len(got), err)
	}
}

func TestHasher(t *testing.T) {
	b := body(5000)
	var h Hasher
	if h.Sum() != Of(nil) || !h.Matches(Of(nil)) {
		t.Fatal("the zero Hasher is not the hash of nothing")
	}
	h.Write(b[:1234])
	state, err := h.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var h2 Hasher
	if err := h2.UnmarshalBinary(state); err != nil {
		t.Fatal(err)
	}
	h.Write(b[1234:])
	h2.Write(b[1234:])
	if !h.Matches(Of(b)) || !h2.Matches(Of(b)) {
		t.Fatal("a continued hash does not match the bytes")
	}
	if h.Matches(Of(b[1:])) {
		t.Fatal("matches other bytes")
	}
	h.Reset()
	if !h.Matches(Of(nil)) {
		t.Fatal("Reset kept bytes")
	}
}

// idOf is the ID of the segment id s: the zero ID when s is not one.
func idOf(s string) ID {
	id, _ := ParseID(s)
	return id
}
