package workload

import (
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
)

// AgainstBareTCP is the one way the payload benchmarks time a
// cross-process get (payload/shm, payload/httppull, payload/mooncake)
// against its floor in the same run: while more() holds (b.Loop), it runs
// get, which returns the time its get took (so that a get can leave its
// setup out), and then reads size bytes from a BareTCPServer of its own
// (in this process) over a new loopback connection (ReadBareTCP). It
// returns the total time of each and the rounds.
func AgainstBareTCP(size int, more func() bool, get func() (time.Duration, error)) (tGet, tTCP time.Duration, rounds int, err error) {
	addr, stop, err := BareTCPServer(make([]byte, size))
	if err != nil {
		return 0, 0, 0, err
	}
	defer stop()
	dst := make([]byte, size)
	for more() {
		d, err := get()
		if err != nil {
			return 0, 0, rounds, err
		}
		t0 := time.Now()
		if err := ReadBareTCP(addr, dst); err != nil {
			return 0, 0, rounds, err
		}
		tTCP += time.Since(t0)
		tGet += d
		rounds++
	}
	return tGet, tTCP, rounds, nil
}

// MetricReporter is a *testing.B (this package does not import testing).
type MetricReporter interface {
	ReportMetric(n float64, unit string)
}

// ReportAgainstBareTCP reports what AgainstBareTCP measured of size bytes
// a round: GB/s-<what> and GB/s-tcp, and x-bare-tcp (what = "get") or
// x-bare-tcp-<what>: the get's time over the baseline's, lower is better.
func ReportAgainstBareTCP(r MetricReporter, what string, size, rounds int, tGet, tTCP time.Duration) {
	if rounds == 0 || tGet <= 0 || tTCP <= 0 {
		return
	}
	n := float64(rounds)
	r.ReportMetric(float64(size)*n/tGet.Seconds()/1e9, "GB/s-"+what)
	r.ReportMetric(float64(size)*n/tTCP.Seconds()/1e9, "GB/s-tcp")
	unit := "x-bare-tcp"
	if what != "get" {
		unit += "-" + what
	}
	r.ReportMetric(float64(tGet)/float64(tTCP), unit)
}

// PatternValue is size bytes of a fixed pattern, as a tensor: what a
// cross-process benchmark's writer puts and its reader checks.
func PatternValue(size int) *payload.Value {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*13 + 1)
	}
	return payload.NewTensor(cachekey.Uint8, []int64{int64(size)}, data)
}
