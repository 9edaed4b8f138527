package storage

import "fmt"

// Name limits. Namespaces and task ids become parts of Redis keys, so only
// these characters are accepted: nothing can open or close a hash tag.
const (
	// MaxNamespaceLen is the longest namespace name.
	MaxNamespaceLen = 63
	// MaxTaskIDLen is the longest task id.
	MaxTaskIDLen = 128
)

// ValidateNamespace reports whether ns is a valid namespace name:
// [a-z0-9][a-z0-9_-]{0,62}. The error says what is allowed.
func ValidateNamespace(ns string) error {
	if ns == "" {
		return fmt.Errorf("is required: 1-%d characters of [a-z0-9_-], starting with [a-z0-9]", MaxNamespaceLen)
	}
	if len(ns) > MaxNamespaceLen {
		return fmt.Errorf("is %d characters long; at most %d are allowed", len(ns), MaxNamespaceLen)
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			return fmt.Errorf("has %q at position %d; allowed: [a-z0-9][a-z0-9_-]{0,62}", rune(c), i)
		}
	}
	return nil
}

// ValidateTaskID reports whether id is a valid task id: 1-128 characters of
// [A-Za-z0-9._-]. The error says what is allowed.
func ValidateTaskID(id string) error {
	if id == "" {
		return fmt.Errorf("is required: 1-%d characters of [A-Za-z0-9._-]", MaxTaskIDLen)
	}
	if len(id) > MaxTaskIDLen {
		return fmt.Errorf("is %d characters long; at most %d are allowed", len(id), MaxTaskIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return fmt.Errorf("has %q at position %d; allowed: 1-%d characters of [A-Za-z0-9._-]", rune(c), i, MaxTaskIDLen)
		}
	}
	return nil
}
