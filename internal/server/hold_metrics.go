package server

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// holdMetrics are the replica's Acquire streams as an SRE reads them: how
// many hold and wait now, the losses told by reason, and how long a
// grant took, split by whether the stream waited behind holders.
type holdMetrics struct {
	holding, waiting atomic.Int64
	losses           map[lockbrokerv1.LostReason]prometheus.Counter // every reason, written once
	lossVec          *prometheus.CounterVec
	// grant: request to `acquired` without a `queued` first (the key was
	// free); wait: the same for a stream that was told `queued`.
	grant, wait prometheus.Histogram
}

// latencyBuckets span a loopback grant (a millisecond) to a long queue.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

func newHoldMetrics() *holdMetrics {
	m := &holdMetrics{
		lossVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockbroker_losses_total",
			Help: "Holds this replica told `lost`, by reason (the LostReason name without its prefix: SESSION_INVALIDATED, RENEWAL_FAILED, BROKER_SHUTDOWN, ...).",
		}, []string{"reason"}),
		grant: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockbroker_acquire_grant_seconds",
			Help:    "Acquire streams that found the key free: from the call's start to `acquired`.",
			Buckets: latencyBuckets,
		}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockbroker_acquire_wait_seconds",
			Help:    "Acquire streams that waited (were told `queued`): from the call's start to `acquired`.",
			Buckets: latencyBuckets,
		}),
	}
	m.losses = make(map[lockbrokerv1.LostReason]prometheus.Counter, len(lockbrokerv1.LostReason_name))
	for v, name := range lockbrokerv1.LostReason_name {
		m.losses[lockbrokerv1.LostReason(v)] = m.lossVec.WithLabelValues(strings.TrimPrefix(name, "LOST_REASON_"))
	}
	return m
}

func (m *holdMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lockbroker_holds",
			Help: "Acquire streams holding a lock or slot on this replica.",
		}, func() float64 { return float64(m.holding.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lockbroker_waiters",
			Help: "Acquire streams waiting on this replica.",
		}, func() float64 { return float64(m.waiting.Load()) }),
		m.lossVec, m.grant, m.wait,
	}
}

// lost counts a loss told with reason r.
func (m *holdMetrics) lost(r lockbrokerv1.LostReason) {
	c, ok := m.losses[r]
	if !ok { // a reason newer than this build's enum
		c = m.losses[lockbrokerv1.LostReason_LOST_REASON_UNSPECIFIED]
	}
	c.Inc()
}
