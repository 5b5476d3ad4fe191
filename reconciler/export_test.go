package reconciler

import "time"

// WithMarkerTTL sets the marker TTL the reconciler assumes of the bucket
// (a test's, shorter than the minute every process uses).
func WithMarkerTTL(d time.Duration) Option {
	return func(s *settings) error { s.markerTTL = d; return nil }
}

// WithStreamCheckEvery sets how often the active reconciler reads the
// event stream's state (a test's, shorter than the minute).
func WithStreamCheckEvery(d time.Duration) Option {
	return func(s *settings) error { s.checkEvery = d; return nil }
}
