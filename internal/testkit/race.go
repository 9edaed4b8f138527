//go:build race

package testkit

// Race reports that this binary was built with -race; Build then builds
// with it too, and tests that run a build of their own follow it.
const Race = true
