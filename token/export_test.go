package token

// Raw returns the whole parsed payload object, extra members included.
// Numbers are float64, arrays []any, objects map[string]any. It parses
// the payload again on each call: verification itself never builds it.
func (c *Claims) Raw() map[string]any {
	v, _ := parseJSON(c.payload)
	m, _ := v.(map[string]any)
	return m
}
