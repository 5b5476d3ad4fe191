package liveui

import (
	_ "embed"
	"encoding/json"
	"net/http"

	"github.com/embcache/embcache/live"
)

//go:embed index.html
var page []byte

// Viewer is where the figures come from: a live.Aggregator, or Lazy.
type Viewer interface {
	View() live.View
}

// Register mounts the page at GET / and its JSON at GET /api/live.
func Register(mux *http.ServeMux, v Viewer) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// Nothing but itself: no external asset is loaded, and none may be.
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		w.Write(page)
	})
	mux.HandleFunc("GET /api/live", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(v.View())
	})
}
