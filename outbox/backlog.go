package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/effectline/effectline/store"
)

// Metric names of the outbox backlog, as the relay reports them. On
// /metrics they read effectline_outbox_backlog and
// effectline_outbox_lag_seconds.
const (
	// MetricOutboxBacklog is the number of outbox rows not yet published.
	MetricOutboxBacklog = "effectline.outbox.backlog"
	// MetricOutboxLag is the age of the oldest unpublished row, 0 when the
	// outbox is empty: how far Kafka is behind the event store.
	MetricOutboxLag = "effectline.outbox.lag"
)

// backlogMinInterval bounds how often the gauges query the database: a
// scrape (or several scrapers) within it reuse the last reading.
const backlogMinInterval = time.Second

// backlogQueryTimeout bounds one reading, so a slow database delays a
// scrape by at most this much (the gauges then keep their last values).
const backlogQueryTimeout = 2 * time.Second

// backlogGauges are the observable gauges of the outbox backlog. They are
// read when metrics are collected (a Prometheus scrape), not on a timer, so
// an unscraped process never queries for them.
type backlogGauges struct {
	store   *store.Store
	meter   metric.Meter
	backlog metric.Int64ObservableGauge
	lag     metric.Float64ObservableGauge

	mu     sync.Mutex
	readAt time.Time
	count  int64
	age    time.Duration
	ok     bool
}

func newBacklogGauges(st *store.Store, mp metric.MeterProvider) (*backlogGauges, error) {
	g := &backlogGauges{store: st, meter: mp.Meter("github.com/effectline/effectline/outbox")}
	var err error
	if g.backlog, err = g.meter.Int64ObservableGauge(MetricOutboxBacklog, metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows waiting to be published to Kafka.")); err != nil {
		return nil, fmt.Errorf("creating %s: %w", MetricOutboxBacklog, err)
	}
	if g.lag, err = g.meter.Float64ObservableGauge(MetricOutboxLag, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest outbox row not yet published; 0 when the outbox is empty.")); err != nil {
		return nil, fmt.Errorf("creating %s: %w", MetricOutboxLag, err)
	}
	return g, nil
}

// register starts reporting; the returned function stops it.
func (g *backlogGauges) register() (func(), error) {
	reg, err := g.meter.RegisterCallback(g.observe, g.backlog, g.lag)
	if err != nil {
		return nil, fmt.Errorf("registering the backlog gauges: %w", err)
	}
	return func() { _ = reg.Unregister() }, nil
}

// observe reports the backlog, reading it at most once per
// backlogMinInterval. When a reading fails the gauges report nothing rather
// than a stale or zero backlog: a missing series is what a "no data" alert
// is for, a zero would hide an outage.
func (g *backlogGauges) observe(ctx context.Context, o metric.Observer) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if now.Sub(g.readAt) >= backlogMinInterval {
		g.readAt = now
		qctx, cancel := context.WithTimeout(ctx, backlogQueryTimeout)
		count, oldest, err := g.store.OutboxBacklog(qctx)
		cancel()
		g.ok = err == nil
		if err != nil {
			return fmt.Errorf("outbox backlog: %w", err)
		}
		g.count, g.age = count, 0
		if !oldest.IsZero() {
			g.age = max(now.Sub(oldest), 0)
		}
	}
	if !g.ok {
		return nil
	}
	o.ObserveInt64(g.backlog, g.count)
	o.ObserveFloat64(g.lag, g.age.Seconds())
	return nil
}
