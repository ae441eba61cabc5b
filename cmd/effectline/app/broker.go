package app

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultEmbeddedRetention is how long the embedded broker keeps a message
// unless told otherwise: at 500 operations/s the topics take about 1.3 MB a
// second of disk.
const DefaultEmbeddedRetention = 2 * time.Minute

// EmbeddedBroker is kfake on 127.0.0.1 only, its log in a temporary
// directory removed by Close. Topics are created by the normal provisioning
// path, as on a real cluster.
//
// On disk rather than in memory: kfake's in-memory mode keeps every
// message on the heap, which was three quarters of a 500/s soak's live
// heap (233 of 302 MB with two minutes of retention); with its log in files
// the broker's share is the batches' index (27 of 89 MB), the messages sit
// in the page cache, and the latency is the same (`docs/benchmarks.md`,
// session 10). Writes are not fsynced, as with Kafka's defaults: a crash of
// dev loses its broker either way.
type EmbeddedBroker struct {
	*kfake.Cluster
	dir        string
	stop, done chan struct{}
}

// StartEmbeddedBroker starts the embedded broker with a retention bound: a
// message older than retention is dropped within a few seconds, as a real
// broker with retention.ms would, unless a consumer group with live
// members has not read it yet. Kafka drops by age alone; here the group
// bound is kept because dev's clock is a laptop's: after a sleep the wall
// clock jumps and every unread message is "old" at once. After a pause of
// this machine in a dev run, every group's position had fallen off the log
// within one millisecond (the executor's intents then wait for its poller,
// the read model for `effectline projector rebuild`): a few more megabytes
// of disk are cheaper. Groups without members (an abandoned kcat, say)
// hold nothing back. retention <= 0 means DefaultEmbeddedRetention.
func StartEmbeddedBroker(partitions int32, retention time.Duration) (*EmbeddedBroker, error) {
	if partitions <= 0 {
		partitions = 12
	}
	if retention <= 0 {
		retention = DefaultEmbeddedRetention
	}
	dir, err := os.MkdirTemp("", "effectline-broker-")
	if err != nil {
		return nil, fmt.Errorf("starting the embedded broker: %w", err)
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.DataDir(dir),
		kfake.DefaultNumPartitions(int(partitions)),
		// The trimming loop below deletes records (kfake's own
		// retention would drop by age alone, so log.retention.ms is not
		// set); whole segments are freed, and the default segment is
		// 100 MB per partition: small segments free space as it goes.
		kfake.BrokerConfigs(map[string]string{
			"log.segment.bytes": strconv.Itoa(1 << 20),
		}),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			_, port, err := net.SplitHostPort(address)
			if err != nil {
				return nil, err
			}
			return net.Listen(network, net.JoinHostPort("127.0.0.1", port))
		}),
	)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("starting the embedded broker: %w", err)
	}
	b := &EmbeddedBroker{Cluster: c, dir: dir, stop: make(chan struct{}), done: make(chan struct{})}
	go b.trimLoop(retention, min(retention/4, 5*time.Second))
	return b, nil
}

func (b *EmbeddedBroker) trimLoop(retention, every time.Duration) {
	defer close(b.done)
	t := time.NewTicker(every)
	defer t.Stop()
	var tr *trimmer
	defer func() {
		if tr != nil {
			tr.close()
		}
	}()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			if tr == nil {
				var err error
				if tr, err = newTrimmer(b.ListenAddrs()); err != nil {
					continue // the broker is not answering yet; next tick
				}
			}
			// An error leaves the messages for the next tick: trimming
			// late costs disk, never a message.
			_ = tr.trim(time.Now().Add(-retention))
		}
	}
}

// trimmer deletes, partition by partition, the records older than a time
// that every live consumer group has read past, talking Kafka's protocol
// to the broker it trims (as an operator's tool would to a real one).
type trimmer struct {
	client sarama.Client
	admin  sarama.ClusterAdmin
}

func newTrimmer(addrs []string) (*trimmer, error) {
	sc := kafka.Config{Brokers: addrs, ClientID: "effectline-embedded-trimmer"}.Sarama()
	sc.Admin.Timeout = 5 * time.Second
	client, err := sarama.NewClient(addrs, sc)
	if err != nil {
		return nil, err
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		client.Close()
		return nil, err
	}
	return &trimmer{client: client, admin: admin}, nil
}

func (t *trimmer) close() { _ = t.admin.Close() }

func (t *trimmer) trim(before time.Time) error {
	read, err := t.readByLiveGroups()
	if err != nil {
		return err
	}
	if err := t.client.RefreshMetadata(); err != nil {
		return err
	}
	topics, err := t.client.Topics()
	if err != nil {
		return err
	}
	for _, topic := range topics {
		partitions, err := t.client.Partitions(topic)
		if err != nil {
			return err
		}
		cut := map[int32]int64{}
		for _, p := range partitions {
			oldest, err := t.client.GetOffset(topic, p, sarama.OffsetOldest)
			if err != nil {
				return err
			}
			// The first offset at or after before; none means every
			// message is older.
			upTo, err := t.client.GetOffset(topic, p, before.UnixMilli())
			if err != nil {
				return err
			}
			if upTo < 0 {
				if upTo, err = t.client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
					return err
				}
			}
			upTo = trimPoint(upTo, read[topic], p)
			if upTo > oldest {
				cut[p] = upTo
			}
		}
		if len(cut) > 0 {
			if err := t.admin.DeleteRecords(topic, cut); err != nil {
				return err
			}
		}
	}
	return nil
}

// trimPoint bounds the age cut of partition p by what each group reading
// the topic has committed there (a group that reads the topic but has
// committed nothing in p has read nothing of it).
func trimPoint(aged int64, groups []map[int32]int64, p int32) int64 {
	for _, committed := range groups {
		aged = min(aged, max(committed[p], 0))
	}
	return aged
}

// readByLiveGroups returns, per topic, the committed offsets of each group
// with members that has committed any offset on it.
func (t *trimmer) readByLiveGroups() (map[string][]map[int32]int64, error) {
	groups, err := t.admin.ListConsumerGroups()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	read := map[string][]map[int32]int64{}
	if len(names) == 0 {
		return read, nil
	}
	described, err := t.admin.DescribeConsumerGroups(names)
	if err != nil {
		return nil, err
	}
	for _, d := range described {
		if len(d.Members) == 0 {
			continue
		}
		offsets, err := t.admin.ListConsumerGroupOffsets(d.GroupId, nil)
		if err != nil {
			return nil, err
		}
		for topic, blocks := range offsets.Blocks {
			committed := map[int32]int64{}
			for p, b := range blocks {
				committed[p] = b.Offset
			}
			read[topic] = append(read[topic], committed)
		}
	}
	return read, nil
}

// Close stops the retention loop and the broker, and removes its log.
func (b *EmbeddedBroker) Close() {
	close(b.stop)
	<-b.done
	b.Cluster.Close()
	_ = os.RemoveAll(b.dir)
}
