//go:build !(mooncake && cgo)

package main

// mooncakeBuilt says whether this binary has the Mooncake transport: this
// one does not (make build-bench-mooncake builds the one that does).
const mooncakeBuilt = false
