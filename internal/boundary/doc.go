// Package boundary holds no code: its test enforces delayd's package
// boundaries, the allowed import arrows drawn in docs/ARCHITECTURE.md.
//
// The test reads every package of the module with `go list -json` (its
// imports, its test files' imports and its transitive dependencies) and
// fails when
//   - a package has no rule (a new package must say what it may import);
//   - a package, or its tests, imports a delayd package its rule does not
//     allow;
//   - production code depends, directly or through another package, on a
//     test-only package (the conformance suites, the test kit, the fakes).
//
// It runs in `make test` (go test ./...) and in `make lint`. To change an
// arrow, change the rules in boundary_test.go and the picture in
// docs/ARCHITECTURE.md in the same commit, and say why.
package boundary
