package agent

import (
	"net/http"
	"time"
)

// heartbeatEvery is the interval of a lookup's heartbeats.
const heartbeatEvery = time.Second

// heartbeat returns what sends a lookup's heartbeat on w, or nil if the
// call did not ask for them.
func heartbeat(w http.ResponseWriter, r *http.Request) func() {
	if r.Header.Get(HeartbeatHeader) != "1" {
		return nil
	}
	return func() { w.WriteHeader(http.StatusProcessing) }
}
