package live

import "time"

// View is the cluster at one moment, as an Aggregator heard it: what
// embcache top draws and serve's page shows (its JSON is the page's).
type View struct {
	Time      time.Time `json:"time"`
	Totals    Totals    `json:"totals"`
	Processes []Process `json:"processes"` // by node, then role, then id
	// Leases are the keys computing now, oldest first (WithLeases).
	Leases     []Lease     `json:"leases"`
	Reconciler *Reconciler `json:"reconciler,omitempty"`
	// History samples Totals' rates once a second, oldest first (the
	// Aggregator's WithHistory span).
	History []Point `json:"history,omitempty"`
	// Received counts the summaries heard, Dropped those that did not
	// decode, by reason ("bad", "version").
	Received uint64            `json:"received"`
	Dropped  map[string]uint64 `json:"dropped,omitempty"`
}

// Counters are cumulative: a process's since it started, or their sum.
type Counters struct {
	Requests      map[string]uint64 `json:"requests"` // by path
	Total         uint64            `json:"total"`    // every request
	Saved         uint64            `json:"saved"`    // answered without a forward of their own
	Forwards      uint64            `json:"forwards"`
	Pulled        map[string]uint64 `json:"pulled_bytes"`  // by transport
	Written       map[string]uint64 `json:"written_bytes"` // by transport
	Degraded      uint64            `json:"degraded"`
	Lost          uint64            `json:"lost"`
	PayloadErrors uint64            `json:"payload_errors"`
}

// Rates are per second, over the span between a process's last two
// summaries (one interval), or their sum.
type Rates struct {
	Requests map[string]float64 `json:"requests"`
	Total    float64            `json:"total"`
	Saved    float64            `json:"saved"`
	Forwards float64            `json:"forwards"`
	Pulled   map[string]float64 `json:"pulled_bytes"`
	Written  map[string]float64 `json:"written_bytes"`
	Degraded float64            `json:"degraded"`
	// HitRatio is Saved / Total, absent (nil) without requests.
	HitRatio *float64 `json:"hit_ratio,omitempty"`
}

// Totals are the sums over the processes heard.
type Totals struct {
	Processes int      `json:"processes"`
	Degraded  int      `json:"degraded_processes"` // processes with the store down, or degraded requests in their last interval
	Held      int64    `json:"held_bytes"`
	Pinned    int64    `json:"pinned_bytes"`
	Counters  Counters `json:"counters"`
	Rates     Rates    `json:"rates"`
	// HitRatio is Saved / Total over the processes' lifetimes, absent
	// without requests.
	HitRatio *float64 `json:"hit_ratio,omitempty"`
}

// Process is one process's last summary, and its rates.
type Process struct {
	Node       string             `json:"node"`
	ID         string             `json:"id"`
	Role       string             `json:"role"`
	Tenant     string             `json:"tenant,omitempty"`
	PID        int                `json:"pid,omitempty"`
	Version    string             `json:"version,omitempty"`
	Started    time.Time          `json:"started"`
	Heard      time.Time          `json:"heard"` // when its last summary arrived
	Seq        uint64             `json:"seq"`
	Missed     uint64             `json:"missed"` // summaries of its seq never heard
	Unsent     uint64             `json:"unsent"` // summaries it could not publish
	Held       int64              `json:"held_bytes"`
	Pinned     int64              `json:"pinned_bytes"`
	StoreDown  bool               `json:"store_down"`
	Degraded   bool               `json:"degraded"`
	Counters   Counters           `json:"counters"`
	Rates      Rates              `json:"rates"`
	Reconciler *ReconcilerFigures `json:"reconciler,omitempty"`
}

// Lease is a key computing now, as its shard's stream last stored it.
type Lease struct {
	Key       string    `json:"key"`    // <tenant>.<keyhex>
	Holder    string    `json:"holder"` // the node of the process computing it
	Owner     string    `json:"owner"`  // <node>/<pid>/<nonce>
	Started   time.Time `json:"started"`
	Heartbeat time.Time `json:"heartbeat"`
	AgeSec    float64   `json:"age_s"`
	// Renewals are the heartbeats written since the reservation: counted
	// as heard, or, for a lease already running when the Aggregator
	// started, estimated from its heartbeat's age at a third of its TTL.
	Renewals int    `json:"renewals"`
	Rev      uint64 `json:"rev"`
}

// Reconciler is the cluster's active reconciler.
type Reconciler struct {
	Owner     string    `json:"owner,omitempty"` // its election record's owner
	Node      string    `json:"node,omitempty"`
	Heartbeat time.Time `json:"heartbeat,omitzero"`
	// LagEvents are the events its durable consumer has not acknowledged,
	// LagSec the age of the oldest of them (0 when it is caught up).
	LagEvents uint64  `json:"lag_events"`
	LagSec    float64 `json:"lag_s"`
	LagKnown  bool    `json:"lag_known"` // the consumer answered (WithReconcilerLag)
	Err       string  `json:"err,omitempty"`
}

// Point is one sample of the totals' rates.
type Point struct {
	Time     time.Time `json:"t"`
	Total    float64   `json:"total"`
	Saved    float64   `json:"saved"`
	Forwards float64   `json:"forwards"`
	HitRatio *float64  `json:"hit_ratio,omitempty"`
}
