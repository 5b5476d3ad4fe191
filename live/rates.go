package live

import "time"

func newCounters() Counters {
	return Counters{Requests: map[string]uint64{}, Pulled: map[string]uint64{}, Written: map[string]uint64{}}
}

func newRates() Rates {
	return Rates{Requests: map[string]float64{}, Pulled: map[string]float64{}, Written: map[string]float64{}}
}

// countersOf are s's counters.
func countersOf(s *Summary) Counters {
	c := newCounters()
	addInto(c.Requests, s.Requests)
	addInto(c.Pulled, s.Pulled)
	addInto(c.Written, s.Written)
	c.Total, c.Saved, c.Forwards = s.Total(), s.Saved(), s.Forwards
	c.Degraded, c.Lost, c.PayloadErrors = s.Degraded, s.Lost, s.PayloadErrors
	return c
}

// add adds o's counts to c.
func (c *Counters) add(o Counters) {
	addInto(c.Requests, o.Requests)
	addInto(c.Pulled, o.Pulled)
	addInto(c.Written, o.Written)
	c.Total += o.Total
	c.Saved += o.Saved
	c.Forwards += o.Forwards
	c.Degraded += o.Degraded
	c.Lost += o.Lost
	c.PayloadErrors += o.PayloadErrors
}

// add adds o's rates to r (HitRatio aside: the sum's is computed from it).
func (r *Rates) add(o Rates) {
	addInto(r.Requests, o.Requests)
	addInto(r.Pulled, o.Pulled)
	addInto(r.Written, o.Written)
	r.Total += o.Total
	r.Saved += o.Saved
	r.Forwards += o.Forwards
	r.Degraded += o.Degraded
}

// addInto adds src's counts or rates to dst's, key by key.
func addInto[N uint64 | float64](dst, src map[string]N) {
	for k, n := range src {
		dst[k] += n
	}
}

// delta is how much a counter grew from before to now. A counter that
// went down was reset (its process restarted): it grew by now.
func delta(before, now uint64) uint64 {
	if now < before {
		return now
	}
	return now - before
}

// ratesBetween are the rates from summary a to b, later ones of one
// process (by their own times: the sender's clock measures both).
func ratesBetween(a, b *Summary) Rates {
	dt := time.Duration(b.Time - a.Time).Seconds()
	return ratesOver(countersOf(a), countersOf(b), dt)
}

// ratesSinceStart are the rates of a process's first summary heard: over
// its life, if it started within two intervals (it just did), else
// unknown (zero) until its next summary.
func ratesSinceStart(s *Summary) Rates {
	life := time.Duration(s.Time - s.Start)
	if life <= 0 || life > 2*time.Duration(s.Every)*time.Millisecond {
		return newRates()
	}
	return ratesOver(newCounters(), countersOf(s), life.Seconds())
}

// ratesOver are the rates at which counters went from a to b in dt seconds.
func ratesOver(a, b Counters, dt float64) Rates {
	r := newRates()
	if dt <= 0 {
		return r
	}
	per := func(x, y uint64) float64 { return float64(delta(x, y)) / dt }
	for k, n := range b.Requests {
		r.Requests[k] = per(a.Requests[k], n)
	}
	for k, n := range b.Pulled {
		r.Pulled[k] = per(a.Pulled[k], n)
	}
	for k, n := range b.Written {
		r.Written[k] = per(a.Written[k], n)
	}
	// The sums of the per-path rates, so that a reset of one path's
	// counter cannot make the total's negative or its ratio above 1.
	for k, n := range r.Requests {
		r.Total += n
		if k != "computed" && k != "degraded" {
			r.Saved += n
		}
	}
	r.Forwards = per(a.Forwards, b.Forwards)
	r.Degraded = per(a.Degraded, b.Degraded)
	r.HitRatio = ratio(r.Saved, r.Total)
	return r
}

// ratio is x / y, or nil if y is 0.
func ratio(x, y float64) *float64 {
	if y <= 0 {
		return nil
	}
	q := x / y
	return &q
}
