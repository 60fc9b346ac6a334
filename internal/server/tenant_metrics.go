package server

import (
	"github.com/prometheus/client_golang/prometheus"
)

// tenantCollector exports each tenant's usage on this replica. Its tenant
// label takes only the names of the current tenants file (and "" for
// callers of no tenant), never a value a caller sends.
type tenantCollector struct {
	a                                     *access
	holds, waiters                        *prometheus.Desc
	acquires, denials, refusals, quotaMax *prometheus.Desc
}

func newTenantCollector(a *access) *tenantCollector {
	l := []string{"tenant"}
	return &tenantCollector{
		a:        a,
		holds:    prometheus.NewDesc("lockbroker_tenant_holds", "Acquire streams of the tenant holding a lock or slot on this replica.", l, nil),
		waiters:  prometheus.NewDesc("lockbroker_tenant_waiters", "Acquire streams of the tenant waiting on this replica.", l, nil),
		acquires: prometheus.NewDesc("lockbroker_tenant_acquires_total", "Grants to the tenant on this replica (Acquire streams that got acquired, TryAcquire calls that succeeded).", l, nil),
		denials:  prometheus.NewDesc("lockbroker_tenant_denials_total", "PERMISSION_DENIED answers to the tenant's callers on this replica (its prefixes, AdminService, Consul's ACLs); tenant \"\" counts callers of no tenant.", l, nil),
		refusals: prometheus.NewDesc("lockbroker_tenant_quota_refusals_total", "RESOURCE_EXHAUSTED answers to the tenant on this replica, by quota (max_holds, max_sessions, acquire_rate, write_rate, write_bytes_rate, read_rate).", []string{"tenant", "quota"}, nil),
		quotaMax: prometheus.NewDesc("lockbroker_tenant_quota_limit", "The tenant's quotas from the tenants file (0: no limit).", []string{"tenant", "quota"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *tenantCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.holds, c.waiters, c.acquires, c.denials, c.refusals, c.quotaMax} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *tenantCollector) Collect(ch chan<- prometheus.Metric) {
	cfg := c.a.cfg.Load()
	if cfg == nil {
		return
	}
	for _, t := range cfg.Tenants {
		u := c.a.quotas.of(t)
		ch <- prometheus.MustNewConstMetric(c.holds, prometheus.GaugeValue, float64(u.holding.Load()), t.Name)
		ch <- prometheus.MustNewConstMetric(c.waiters, prometheus.GaugeValue, float64(u.waiting.Load()), t.Name)
		ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(u.acquires.Load()), t.Name)
		ch <- prometheus.MustNewConstMetric(c.denials, prometheus.CounterValue, float64(u.denials.Load()), t.Name)
		limits := []float64{float64(t.MaxHolds), float64(t.MaxSessions), t.AcquireRate, t.WriteRate, t.WriteBytesRate, t.ReadRate}
		for i, q := range quotaNames {
			ch <- prometheus.MustNewConstMetric(c.refusals, prometheus.CounterValue, float64(u.refused[i].Load()), t.Name, q)
			ch <- prometheus.MustNewConstMetric(c.quotaMax, prometheus.GaugeValue, limits[i], t.Name, q)
		}
	}
	none := c.a.quotas.lookup("")
	ch <- prometheus.MustNewConstMetric(c.denials, prometheus.CounterValue, float64(none.denials.Load()), "")
}
