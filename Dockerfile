# The embcache image: one static binary (make build, CGO_ENABLED=0) on an
# empty base, so nothing is pulled. Build context: the repository root.
FROM scratch
COPY bin/embcache /embcache
ENTRYPOINT ["/embcache"]
