// Package liveui serves the cluster's live view in a browser: one page
// (HTML, CSS and JavaScript embedded in the binary, no external assets,
// so it works offline) that polls a JSON endpoint once a second and shows
// the totals, a chart of the hit ratio and the forwards saved over the
// last minutes, the leases computing now, the reconciler and every
// process. embcache serve mounts it on its --metrics-listen port, at /
// and /api/live; the figures are a live.Aggregator's View.
package liveui
