package app

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

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
// broker with retention.ms would (kfake applies retention only when told,
// so a loop here tells it). A consumer further behind than that loses the
// messages from Kafka only: an intent dropped unread is still found by the
// executor's due-time poller, and the read model can be rebuilt from the
// journal (`effectline projector rebuild`). retention <= 0 means
// DefaultEmbeddedRetention.
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
		// Retention drops whole batches of the segments it has, and the
		// default segment is 100 MB per partition: small segments let it
		// drop as it goes.
		kfake.BrokerConfigs(map[string]string{
			"log.retention.ms":  strconv.FormatInt(retention.Milliseconds(), 10),
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
	go b.applyRetention(min(retention/4, 5*time.Second))
	return b, nil
}

func (b *EmbeddedBroker) applyRetention(every time.Duration) {
	defer close(b.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.ApplyRetention()
		}
	}
}

// Close stops the retention loop and the broker, and removes its log.
func (b *EmbeddedBroker) Close() {
	close(b.stop)
	<-b.done
	b.Cluster.Close()
	_ = os.RemoveAll(b.dir)
}
