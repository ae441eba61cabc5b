package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// MetricConsumerLag is the consumer lag gauge: messages in a topic that a
// consumer group has not committed yet, summed over the topic's partitions.
// On /metrics it reads effectline_kafka_consumer_lag{group,topic}.
const MetricConsumerLag = "effectline.kafka.consumer_lag"

// GroupTopic is a consumer group and the topic it consumes.
type GroupTopic struct {
	Group string
	Topic string
}

// LagConfig tunes a LagMonitor.
type LagConfig struct {
	// Interval between measurements. Default 5s: lag is for dashboards and
	// alerts over minutes, and each measurement costs a request per
	// partition.
	Interval time.Duration
	// MeterProvider serves the gauge. Default: the global provider.
	MeterProvider metric.MeterProvider
	// Logger receives the monitor's logs. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults fills unset fields.
func (c LagConfig) WithDefaults() LagConfig {
	if c.Interval <= 0 {
		c.Interval = 5 * time.Second
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// LagMonitor measures the lag of consumer groups from outside them: the
// high-water mark of each partition minus the group's committed offset
// (the oldest retained offset where the group has committed nothing, since
// effectline's groups start at the oldest message). It reads what the
// broker knows, so it sees the lag of every replica of a group, including
// replicas that are stuck or gone, which a consumer's own view would miss.
// The committed offsets trail the processed ones by at most the
// auto-commit interval (200ms), which the lag includes.
type LagMonitor struct {
	cfg    Config
	groups []GroupTopic
	lcfg   LagConfig
	log    *slog.Logger
	meter  metric.Meter
	gauge  metric.Int64ObservableGauge

	mu   sync.Mutex
	last map[GroupTopic]int64 // nil when the last measurement failed
}

// NewLagMonitor returns a monitor of groups. It does no I/O: Run connects.
func NewLagMonitor(c Config, groups []GroupTopic, lcfg LagConfig) (*LagMonitor, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	lcfg = lcfg.WithDefaults()
	m := &LagMonitor{
		cfg: c, groups: append([]GroupTopic(nil), groups...), lcfg: lcfg,
		log:   lcfg.Logger.With("component", "kafka_lag"),
		meter: lcfg.MeterProvider.Meter("github.com/effectline/effectline/internal/kafka"),
	}
	var err error
	if m.gauge, err = m.meter.Int64ObservableGauge(MetricConsumerLag, metric.WithUnit("{message}"),
		metric.WithDescription("Messages not yet committed by a consumer group, by group and topic (summed over partitions).")); err != nil {
		return nil, fmt.Errorf("creating %s: %w", MetricConsumerLag, err)
	}
	return m, nil
}

// Lag returns the last measurement, nil if there is none or it failed.
func (m *LagMonitor) Lag() map[GroupTopic]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last == nil {
		return nil
	}
	out := make(map[GroupTopic]int64, len(m.last))
	for k, v := range m.last {
		out[k] = v
	}
	return out
}

// Run measures at once and then every Interval until ctx ends, and serves
// the gauge meanwhile. A failing measurement is logged once per streak and
// clears the gauge (a missing series, not a stale one), and Run goes on: a
// monitor never stops the process it watches.
func (m *LagMonitor) Run(ctx context.Context) error {
	reg, err := m.meter.RegisterCallback(m.observe, m.gauge)
	if err != nil {
		return fmt.Errorf("kafka lag: registering the gauge: %w", err)
	}
	defer func() { _ = reg.Unregister() }()

	var (
		client   sarama.Client
		admin    sarama.ClusterAdmin
		failures int
	)
	defer func() {
		if admin != nil {
			_ = admin.Close() // closes client too
		}
	}()
	ticker := time.NewTicker(m.lcfg.Interval)
	defer ticker.Stop()
	for {
		if admin == nil {
			client, admin, err = m.connect()
		}
		var lag map[GroupTopic]int64
		if err == nil {
			lag, err = m.measure(ctx, client, admin)
		}
		m.mu.Lock()
		m.last = lag
		m.mu.Unlock()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			if failures == 0 {
				m.log.WarnContext(ctx, "kafka lag: measuring failed; retrying", "error", err)
			}
			failures++
			if admin != nil {
				// Start over with a fresh connection: sarama's client
				// does not always recover from a broker that restarted.
				_ = admin.Close()
				client, admin = nil, nil
			}
		case failures > 0:
			m.log.InfoContext(ctx, "kafka lag: measuring again", "failed_attempts", failures)
			failures = 0
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (m *LagMonitor) connect() (sarama.Client, sarama.ClusterAdmin, error) {
	sc := m.cfg.Sarama()
	sc.ClientID = m.cfg.ClientID + "-lag"
	sc.Admin.Timeout = 5 * time.Second
	client, err := sarama.NewClient(m.cfg.Brokers, sc)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to %v: %w", m.cfg.Brokers, err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, fmt.Errorf("connecting to %v: %w", m.cfg.Brokers, err)
	}
	return client, admin, nil
}

// measure reads the lag of every group. Offsets are read partition by
// partition; a measurement is a few dozen small requests.
func (m *LagMonitor) measure(ctx context.Context, client sarama.Client, admin sarama.ClusterAdmin) (map[GroupTopic]int64, error) {
	out := make(map[GroupTopic]int64, len(m.groups))
	for _, gt := range m.groups {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		parts, err := client.Partitions(gt.Topic)
		if err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", gt.Topic, err)
		}
		resp, err := admin.ListConsumerGroupOffsets(gt.Group, map[string][]int32{gt.Topic: parts})
		// A group that has never committed is, to Kafka, a group with no
		// offsets; some brokers (kfake) say it does not exist instead.
		noGroup := errors.Is(err, sarama.ErrGroupIDNotFound)
		if err != nil && !noGroup {
			return nil, fmt.Errorf("offsets of group %s: %w", gt.Group, err)
		}
		var lag int64
		for _, p := range parts {
			newest, err := client.GetOffset(gt.Topic, p, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("high-water mark of %s/%d: %w", gt.Topic, p, err)
			}
			committed := int64(-1)
			var b *sarama.OffsetFetchResponseBlock
			if !noGroup && resp != nil {
				b = resp.GetBlock(gt.Topic, p)
			}
			if b != nil {
				if b.Err != sarama.ErrNoError {
					return nil, fmt.Errorf("offset of group %s on %s/%d: %w", gt.Group, gt.Topic, p, b.Err)
				}
				committed = b.Offset
			}
			if committed < 0 {
				// Nothing committed: the group starts at the oldest
				// retained message.
				if committed, err = client.GetOffset(gt.Topic, p, sarama.OffsetOldest); err != nil {
					return nil, fmt.Errorf("oldest offset of %s/%d: %w", gt.Topic, p, err)
				}
			}
			lag += max(newest-committed, 0)
		}
		out[gt] = lag
	}
	return out, nil
}

func (m *LagMonitor) observe(_ context.Context, o metric.Observer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for gt, lag := range m.last {
		o.ObserveInt64(m.gauge, lag, metric.WithAttributes(
			attribute.String("group", gt.Group), attribute.String("topic", gt.Topic)))
	}
	return nil
}
