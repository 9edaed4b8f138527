//go:build !race

package clients_test

// raceBuild: see race_test.go.
const raceBuild = false
