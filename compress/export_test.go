package compress

// NegotiateValues is the coding AcceptedValues puts first (Identity when
// none): the tests' oracle of the negotiation rules. It does not
// allocate.
func NegotiateValues(values []string, prefs []Coding) Coding {
	var a acceptance
	a.reset()
	for _, v := range values {
		a.parse(v)
	}
	return a.choose(prefs)
}
