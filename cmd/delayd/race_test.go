//go:build race

package main

// raceBuild: this test binary was built with -race, so buildBinary builds
// delayd with -race too. Its packages are then the ones `go test -race` (and
// `go vet -race`, see the Makefile) already compiled, so the build is a link
// instead of a second compilation of every dependency, and the fault suite
// checks the real server processes for data races.
const raceBuild = true
