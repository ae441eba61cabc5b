package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// Producer publishes batches of events and returns when the brokers have
// acknowledged every one of them.
//
// It builds the produce requests itself, on sarama's client and wire
// protocol: one request per leader broker, holding one record batch per
// partition, sent at once and awaited together. sarama's SyncProducer
// passes each message through a pipeline of goroutines (dispatcher, topic,
// partition and broker producers, then back through the acknowledgements)
// and a flush timer; BenchmarkPublishLatency in this package measures what
// that costs a relay batch on a busy machine, where the relay waits out
// every batch before claiming the next.
//
// Order per operation key needs no idempotent producer here: a partition's
// records of a Send are one record batch in one request, which Kafka appends
// whole or not at all (a Send larger than a request may carry goes out in
// rounds, each sent only once the one before was acknowledged in full), and
// the relay sends its next batch only after this one was acknowledged. When
// a request fails the relay publishes the whole batch again; records already
// appended are then duplicated, never reordered, and consumers deduplicate
// by (operation_key, seq).
type Producer struct {
	client   sarama.Client
	conf     *sarama.Config
	timeout  time.Duration
	version  int16
	maxBytes int // per partition and request
}

// NewProducer connects a producer to the cluster.
func NewProducer(c Config) (*Producer, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	sc := c.Sarama()
	sc.ClientID = c.ClientID + "-relay"
	client, err := sarama.NewClient(c.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka producer on %v: %w", c.Brokers, err)
	}
	return &Producer{
		client:   client,
		conf:     sc,
		timeout:  sc.Producer.Timeout,
		version:  produceRequestVersion(sc.Version),
		maxBytes: sc.Producer.MaxMessageBytes,
	}, nil
}

// produceRequestVersion is the produce request version sarama's own
// producer uses for v; 3 is the first with record batches.
func produceRequestVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 7
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 6
	case v.IsAtLeast(sarama.V1_0_0_0):
		return 5
	}
	return 3
}

// Send publishes records and waits for every acknowledgement, or until ctx
// ends. On error some records may have been published: the relay
// republishes the whole batch, and consumers deduplicate by
// (operation_key, seq). A request already sent when ctx ends is not
// recalled; its records may still be appended.
func (p *Producer) Send(ctx context.Context, records []Record) error {
	parts := partitioners{}
	for len(records) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		reqs, rest, err := p.requests(records, parts)
		if err != nil {
			return err
		}
		errs := make(chan error, len(reqs))
		for broker, req := range reqs {
			go func() { errs <- p.produce(broker, req) }()
		}
		var first error
		for range reqs {
			select {
			case err := <-errs:
				if err != nil && first == nil {
					first = err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if first != nil {
			return first
		}
		records = rest
	}
	return nil
}

// target is a topic's partition.
type target struct {
	topic     string
	partition int32
}

// brokerRequest is one produce request and the partitions it writes.
type brokerRequest struct {
	req     *sarama.ProduceRequest
	targets []target
}

// requests groups a prefix of records into one produce request per leader
// broker, with one record batch per partition in the records' order, and
// returns the records left for the next round: those from the first one
// that would take its partition's batch past the request size limit.
func (p *Producer) requests(records []Record, parts partitioners) (_ map[*sarama.Broker]*brokerRequest, rest []Record, _ error) {
	now := time.Now().Truncate(time.Millisecond)
	batches := map[target]*sarama.RecordBatch{}
	sizes := map[target]int{}
	var order []target
	for i, r := range records {
		partition, err := parts.partition(p.client, r)
		if err != nil {
			return nil, nil, err
		}
		t := target{r.Topic, partition}
		// A conservative size: the record's bytes and a margin for its
		// framing and headers. One record over the limit still goes, alone,
		// and the broker says why it refuses it.
		size := len(r.Value) + len(r.Key) + 512
		for _, h := range r.Headers {
			size += len(h.Key) + len(h.Value)
		}
		if sizes[t] > 0 && sizes[t]+size > p.maxBytes {
			rest = records[i:]
			break
		}
		sizes[t] += size
		b := batches[t]
		if b == nil {
			b = &sarama.RecordBatch{Version: 2, FirstTimestamp: now, MaxTimestamp: now,
				ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1}
			batches[t] = b
			order = append(order, t)
		}
		b.Records = append(b.Records, record(r, int64(len(b.Records))))
	}
	reqs := map[*sarama.Broker]*brokerRequest{}
	for _, t := range order {
		leader, err := p.client.Leader(t.topic, t.partition)
		if err != nil {
			p.refresh(t.topic)
			return nil, nil, fmt.Errorf("publishing to %s/%d: finding its leader: %w", t.topic, t.partition, err)
		}
		br := reqs[leader]
		if br == nil {
			br = &brokerRequest{req: &sarama.ProduceRequest{RequiredAcks: sarama.WaitForAll,
				Timeout: int32(p.timeout / time.Millisecond), Version: p.version}}
			reqs[leader] = br
		}
		b := batches[t]
		b.LastOffsetDelta = int32(len(b.Records) - 1)
		br.req.AddBatch(t.topic, t.partition, b)
		br.targets = append(br.targets, t)
	}
	return reqs, rest, nil
}

// partitioners holds, for one Send, each topic's murmur2 partitioner (the
// Java client's default, so a non-Go producer puts a key where the relay
// does) and partition count, so the metadata is looked up once per topic
// rather than per record, and Sends share no state.
type partitioners map[string]*topicPartitioner

type topicPartitioner struct {
	p sarama.Partitioner
	n int32
}

func (ps partitioners) partition(client sarama.Client, r Record) (int32, error) {
	tp := ps[r.Topic]
	if tp == nil {
		partitions, err := client.Partitions(r.Topic)
		if err != nil {
			return 0, fmt.Errorf("publishing to %s: %w", r.Topic, err)
		}
		if len(partitions) == 0 {
			return 0, fmt.Errorf("publishing to %s: %w", r.Topic, sarama.ErrUnknownTopicOrPartition)
		}
		tp = &topicPartitioner{p: sarama.NewMurmur2Partitioner(r.Topic), n: int32(len(partitions))}
		ps[r.Topic] = tp
	}
	m := &sarama.ProducerMessage{}
	if r.Key != nil {
		m.Key = sarama.ByteEncoder(r.Key)
	}
	return tp.p.Partition(m, tp.n)
}

func record(r Record, offset int64) *sarama.Record {
	h := make([]*sarama.RecordHeader, len(r.Headers))
	for i, x := range r.Headers {
		h[i] = &sarama.RecordHeader{Key: []byte(x.Key), Value: x.Value}
	}
	return &sarama.Record{Key: r.Key, Value: r.Value, Headers: h, OffsetDelta: offset}
}

// produce sends one request and checks every partition's answer. A broker
// that failed is closed, so the next Send reconnects; metadata is refreshed
// when a partition's leadership moved.
func (p *Producer) produce(broker *sarama.Broker, br *brokerRequest) error {
	resp, err := broker.Produce(br.req)
	for try := 1; errors.Is(err, sarama.ErrNotConnected) && try <= connectTries; try++ {
		// Nothing was sent. Either another Send closed the connection after
		// its request failed, or it is opening it: sarama marks a broker
		// open before it takes the lock its dial holds, and a request in
		// that gap finds no connection. Open it (or find it opening), wait
		// for the dial, and send again.
		if oerr := broker.Open(p.conf); oerr != nil && !errors.Is(oerr, sarama.ErrAlreadyConnected) {
			err = oerr
			break
		}
		if ok, _ := broker.Connected(); !ok {
			time.Sleep(time.Duration(try) * 10 * time.Millisecond)
		}
		resp, err = broker.Produce(br.req)
	}
	if err != nil {
		_ = broker.Close()
		p.refresh()
		return fmt.Errorf("publishing to broker %d: %w", broker.ID(), err)
	}
	var failed error
	for _, t := range br.targets {
		block := resp.GetBlock(t.topic, t.partition)
		switch {
		case block == nil:
			failed = errors.Join(failed, fmt.Errorf("publishing to %s/%d: no answer from broker %d", t.topic, t.partition, broker.ID()))
		case !errors.Is(block.Err, sarama.ErrNoError):
			failed = errors.Join(failed, fmt.Errorf("publishing to %s/%d: %w", t.topic, t.partition, block.Err))
		}
	}
	if failed != nil {
		p.refresh()
	}
	return failed
}

// connectTries bounds how often produce reopens a connection it found
// closed or still opening before it gives the error to the relay.
const connectTries = 3

func (p *Producer) refresh(topics ...string) { _ = p.client.RefreshMetadata(topics...) }

// Close closes the producer's connections.
func (p *Producer) Close() error { return p.client.Close() }
