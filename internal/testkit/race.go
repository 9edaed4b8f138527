//go:build race

package testkit

// raceEnabled: this binary was built with -race, so Build builds with it too.
const raceEnabled = true
