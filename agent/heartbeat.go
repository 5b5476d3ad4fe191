package agent

import (
	"net/http"
	"time"
)

// HeartbeatHeader asks for heartbeats while a lookup waits: a client that
// sends it ("1") gets a 102 Processing answer every heartbeatEvery until
// the final answer, so it can bound each silence by a short timeout (a
// hung agent is noticed in seconds) while a lookup waits minutes for
// another process's compute. HTTP/1.1 clients skip 1xx answers.
const HeartbeatHeader = "Embcache-Heartbeat"

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
