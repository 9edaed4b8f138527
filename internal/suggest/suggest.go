// Package suggest finds the name someone probably meant: the closest of a
// set of known names to a misspelt one (a flag, an environment variable,
// an HTTP path), for "did you mean …?" in an error. A leaf: it imports no
// delayd package.
package suggest

import "slices"

// Closest returns the one of names nearest to s by edit distance (the first
// in sorted order among equals), and whether it is near enough to suggest:
// at most a third of s's length away (at least 2), so that a misspelling
// gets a suggestion and an unrelated word does not. names is not modified.
func Closest(s string, names []string) (string, bool) {
	sorted := slices.Sorted(slices.Values(names))
	best, bestD := "", -1
	for _, n := range sorted {
		if d := Distance(s, n); bestD < 0 || d < bestD {
			best, bestD = n, d
		}
	}
	return best, bestD >= 0 && bestD <= max(2, len(s)/3)
}

// Distance is the Levenshtein distance of a and b, in bytes.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
