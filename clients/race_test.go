//go:build race

package clients_test

// raceBuild: this test binary was built with -race, so delaydBinary builds
// delayd with -race too: make test's go vet -race has compiled those
// packages already, so the build is a link.
const raceBuild = true
