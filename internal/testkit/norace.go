//go:build !race

package testkit

// Race reports that this binary was built with -race (see race.go).
const Race = false
