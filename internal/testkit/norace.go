//go:build !race

package testkit

// raceEnabled: this binary was built without -race, and so is what Build makes.
const raceEnabled = false
