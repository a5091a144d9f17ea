package caddymodule

import (
	"slices"
	"strings"
)

// didYouMean returns ` (did you mean "x"?)` when exactly the closest of
// known is near got (an edit distance of at most a third of the word,
// and at least 1 — stroe, kyes, deliverey), else "". It is appended to
// the "unknown subdirective/value" errors of the Caddyfile parser.
func didYouMean(got string, known []string) string {
	got = strings.ToLower(got)
	best, bestD, tie := "", len(got)+1, false
	for _, k := range known {
		d := editDistance(got, k)
		switch {
		case d < bestD:
			best, bestD, tie = k, d, false
		case d == bestD && k != best:
			tie = true
		}
	}
	limit := max(1, len(got)/3)
	if best == "" || bestD == 0 || bestD > limit || tie {
		return ""
	}
	return ` (did you mean "` + best + `"?)`
}

// keysOf is the sorted keys of a map, for didYouMean.
func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// editDistance is the optimal string alignment distance of a and b:
// insertions, deletions, substitutions and swaps of neighbours cost 1.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
