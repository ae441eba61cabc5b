package outbox

import "github.com/effectline/effectline/internal/kafka"

// NewKafkaPublisher returns the Publisher effectline's own processes relay
// with: a Kafka producer for the brokers and topic prefix of c, which is
// the Kafka field of any component's Config (executor.Config{}.Kafka with
// Brokers set, say). A program outside this module cannot write a
// Publisher of its own, whose records are of an internal type, so this is
// how it builds a Relay. Close the producer after the relay's Run returns.
func NewKafkaPublisher(c kafka.Config) (*kafka.Producer, error) {
	return kafka.NewProducer(c)
}
