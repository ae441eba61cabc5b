package app

import (
	"fmt"
	"net"

	"github.com/twmb/franz-go/pkg/kfake"
)

// StartEmbeddedBroker starts kfake on 127.0.0.1 only. Topics are created by
// the normal provisioning path, as on a real cluster.
func StartEmbeddedBroker(partitions int32) (*kfake.Cluster, error) {
	if partitions <= 0 {
		partitions = 12
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.DefaultNumPartitions(int(partitions)),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			_, port, err := net.SplitHostPort(address)
			if err != nil {
				return nil, err
			}
			return net.Listen(network, net.JoinHostPort("127.0.0.1", port))
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("starting the embedded broker: %w", err)
	}
	return c, nil
}
