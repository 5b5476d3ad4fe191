//go:build mooncake && cgo

package main

// mooncakeBuilt says whether this binary has the Mooncake transport: built
// with cgo and -tags mooncake (make build-bench-mooncake), its workers'
// node package has it.
const mooncakeBuilt = true
