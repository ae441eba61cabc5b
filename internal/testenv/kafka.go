package testenv

import (
	"context"
	"errors"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// produceTimeout bounds [Broker.Produce]. kfake answers in microseconds, so
// hitting this means the topic does not exist (auto-creation is off) or the
// cluster is gone; waiting longer would only hide that.
const produceTimeout = 10 * time.Second

// Broker is an in-process Kafka-protocol cluster for one test.
type Broker struct {
	// Addrs are the host:port seed addresses, all on 127.0.0.1, to hand to
	// franz-go (kgo.SeedBrokers) or sarama clients.
	Addrs []string
	// Cluster is the underlying kfake cluster, exposed for tests that need
	// its control hooks (e.g. Cluster.ControlKey to inject broker errors).
	Cluster *kfake.Cluster

	autoCreate bool
}

// Record is a consumed Kafka record, flattened for easy assertions.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	// Headers maps header keys to values; if a key repeats, the last value
	// wins.
	Headers map[string]string
}

// BrokerOption configures [NewBroker].
type BrokerOption func(*brokerConfig)

type brokerConfig struct {
	numBrokers int
	partitions int
	autoCreate bool
	seeds      []seed
	extra      []kfake.Opt
}

type seed struct {
	partitions int32
	topics     []string
}

// WithPartitions sets how many partitions auto-created topics and topics
// created with -1 partitions get (kfake's DefaultNumPartitions; default 10).
func WithPartitions(n int) BrokerOption {
	return func(c *brokerConfig) { c.partitions = n }
}

// WithTopics creates topics with the given partition count before the broker
// accepts connections, for tests of code that consumes topics it does not
// provision itself. A non-positive partitions uses the default partition
// count. The option may be repeated.
func WithTopics(partitions int32, topics ...string) BrokerOption {
	return func(c *brokerConfig) {
		c.seeds = append(c.seeds, seed{partitions, append([]string(nil), topics...)})
	}
}

// WithAutoCreate lets metadata requests create missing topics, like a broker
// with auto.create.topics.enable=true. It is off by default because effectline
// provisions its own topics, and a test broker that silently creates them
// would hide a missing provisioning step.
func WithAutoCreate() BrokerOption {
	return func(c *brokerConfig) { c.autoCreate = true }
}

// WithNumBrokers sets how many brokers the cluster has (default 1). More
// than one spreads partition leadership, for tests of leader movement.
func WithNumBrokers(n int) BrokerOption {
	return func(c *brokerConfig) { c.numBrokers = n }
}

// WithKfakeOptions passes extra options straight to kfake.NewCluster, for
// knobs this package does not wrap (group session timeouts, broker configs).
// Listener options are overridden: the cluster always binds 127.0.0.1.
func WithKfakeOptions(opts ...kfake.Opt) BrokerOption {
	return func(c *brokerConfig) { c.extra = append(c.extra, opts...) }
}

// NewBroker starts a kfake cluster on 127.0.0.1 with random ports and closes
// it when the test finishes. Topic auto-creation is off unless
// [WithAutoCreate] is given.
func NewBroker(t testing.TB, opts ...BrokerOption) *Broker {
	t.Helper()

	cfg := brokerConfig{numBrokers: 1}
	for _, o := range opts {
		o(&cfg)
	}

	kopts := []kfake.Opt{kfake.NumBrokers(cfg.numBrokers)}
	if cfg.partitions > 0 {
		kopts = append(kopts, kfake.DefaultNumPartitions(cfg.partitions))
	}
	if cfg.autoCreate {
		kopts = append(kopts, kfake.AllowAutoTopicCreation())
	}
	for _, s := range cfg.seeds {
		kopts = append(kopts, kfake.SeedTopics(s.partitions, s.topics...))
	}
	kopts = append(kopts, cfg.extra...)
	// Last, so nothing in cfg.extra can widen the bind address.
	kopts = append(kopts, kfake.ListenFn(listenLoopback))

	cluster, err := kfake.NewCluster(kopts...)
	if err != nil {
		t.Fatalf("testenv: starting kfake cluster: %v", err)
	}
	t.Cleanup(cluster.Close)

	return &Broker{
		Addrs:      cluster.ListenAddrs(),
		Cluster:    cluster,
		autoCreate: cfg.autoCreate,
	}
}

// listenLoopback is kfake's listener function. kfake already asks for
// 127.0.0.1, but we pin the host here anyway so that a future kfake default
// (or a Ports option meant for another interface) can never expose a test
// broker on the network.
func listenLoopback(network, address string) (net.Listener, error) {
	_, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	return net.Listen(network, net.JoinHostPort("127.0.0.1", port))
}

// client returns a franz-go client on the broker with opts added.
func (b *Broker) client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	base := []kgo.Opt{kgo.SeedBrokers(b.Addrs...)}
	if b.autoCreate {
		base = append(base, kgo.AllowAutoTopicCreation())
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatalf("testenv: creating kafka client: %v", err)
	}
	return cl
}

// readAllGrace is how long past its timeout ReadAll keeps reading to catch up
// with records that were already in the topic when it was called. It only
// matters on a badly overloaded machine; it is a backstop against hanging,
// not a tuning knob.
const readAllGrace = 30 * time.Second

// ReadAll reads topic from offset 0 of every partition, without a consumer
// group, until it has at least want records or timeout elapses, and returns
// them sorted by partition and offset.
//
// It does not fail the test when fewer than want records arrive: the caller
// asserts on len. That makes it usable for negative checks too, e.g. asking
// for want+1 records with a short timeout proves no duplicate was published.
// For those checks to be reliable on a slow CI machine, ReadAll always returns
// every record that was already in the topic when it was called, reading past
// timeout if it must; the timeout only bounds waiting for records that have
// not been published yet. So the result can exceed want: it holds at least
// every record that was in the topic at the call, and whatever else arrived
// in the same fetches. With want <= 0 it reads until the timeout.
func (b *Broker) ReadAll(t testing.TB, topic string, want int, timeout time.Duration) []Record {
	t.Helper()

	cl := b.client(t,
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	defer cl.Close()

	soft := time.Now().Add(timeout)
	hardCtx, cancel := context.WithTimeout(t.Context(), timeout+readAllGrace)
	defer cancel()

	ends := endOffsets(hardCtx, cl, topic)
	next := make(map[int32]int64, len(ends))
	caughtUp := func() bool {
		for p, end := range ends {
			if next[p] < end {
				return false
			}
		}
		return true
	}

	var (
		out     []Record
		lastErr error
	)
	for {
		// Having want records is not enough: every record already in the
		// topic is read, or a check for one partition's message passes or
		// fails by which partition's fetch came back first.
		if want > 0 && len(out) >= want && caughtUp() {
			break
		}
		pollCtx, pollCancel := hardCtx, context.CancelFunc(func() {})
		if time.Now().Before(soft) {
			pollCtx, pollCancel = context.WithDeadline(hardCtx, soft)
		} else if caughtUp() {
			break
		}
		fetches := cl.PollFetches(pollCtx)
		pollCancel()
		fetches.EachRecord(func(r *kgo.Record) {
			out = append(out, toRecord(r))
			next[r.Partition] = max(next[r.Partition], r.Offset+1)
		})
		for _, fe := range fetches.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) && !errors.Is(fe.Err, context.Canceled) {
				lastErr = fe.Err
			}
		}
		if hardCtx.Err() != nil || fetches.IsClientClosed() {
			break
		}
	}
	if !caughtUp() {
		t.Logf("testenv: ReadAll(%q) gave up before reading every record already in the topic (ends %v, read up to %v)", topic, ends, next)
	}
	if want > 0 && len(out) < want && lastErr != nil {
		t.Logf("testenv: ReadAll(%q) got %d of %d records in %v; last fetch error: %v", topic, len(out), want, timeout, lastErr)
	}

	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Partition != out[j].Partition {
			return out[i].Partition < out[j].Partition
		}
		return out[i].Offset < out[j].Offset
	})
	return out
}

// endOffsets returns the high watermark of every partition of topic, or nil if
// the topic does not exist (yet) or the broker cannot say.
func endOffsets(ctx context.Context, cl *kgo.Client, topic string) map[int32]int64 {
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil || len(mresp.Topics) != 1 || mresp.Topics[0].ErrorCode != 0 {
		return nil
	}

	lo := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	for _, p := range mresp.Topics[0].Partitions {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition = p.Partition
		lp.Timestamp = -1 // latest: the high watermark
		lt.Partitions = append(lt.Partitions, lp)
	}
	lo.Topics = append(lo.Topics, lt)
	lresp, err := lo.RequestWith(ctx, cl)
	if err != nil {
		return nil
	}
	ends := make(map[int32]int64)
	for _, rt := range lresp.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode == 0 && rp.Offset > 0 {
				ends[rp.Partition] = rp.Offset
			}
		}
	}
	return ends
}

// Produce synchronously publishes one record to topic, failing the test if the
// broker does not acknowledge it. Headers are written in key order so runs
// are reproducible. Without [WithAutoCreate] the topic must already exist.
func (b *Broker) Produce(t testing.TB, topic string, key, value []byte, headers map[string]string) {
	t.Helper()

	cl := b.client(t)
	defer cl.Close()

	rec := &kgo.Record{Topic: topic, Key: key, Value: value}
	keys := make([]string, 0, len(headers))
	for k := range headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(headers[k])})
	}

	ctx, cancel := context.WithTimeout(t.Context(), produceTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatalf("testenv: producing to %q: %v", topic, err)
	}
}

func toRecord(r *kgo.Record) Record {
	rec := Record{
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
		Key:       r.Key,
		Value:     r.Value,
	}
	if len(r.Headers) > 0 {
		rec.Headers = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			rec.Headers[h.Key] = string(h.Value)
		}
	}
	return rec
}
