module github.com/embcache/embcache

go 1.26.0

require (
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/zeebo/blake3 v0.2.4
	go.uber.org/goleak v1.3.0
	pgregory.net/rapid v1.3.0
)

require (
	github.com/klauspost/cpuid/v2 v2.0.12 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
