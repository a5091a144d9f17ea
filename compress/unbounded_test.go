package compress

import "io"

// Encode and Negotiate are the unbounded and single-field forms of
// EncodeBounded and NegotiateValues, which the edge calls; the tests and
// benchmarks drive the coders and the Accept-Encoding rules through them.

// Encode is EncodeBounded without a budget.
func Encode(c Coding, dst io.Writer, src io.Reader) (written int64, err error) {
	cw := &countWriter{w: dst}
	err = chosen().encode(c, cw, src)
	return cw.n, err
}

// Negotiate is NegotiateValues of one field value.
func Negotiate(acceptEncoding string, prefs []Coding) Coding {
	return NegotiateValues([]string{acceptEncoding}, prefs)
}
