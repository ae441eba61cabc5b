package metrics

import (
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// Counter describes one Int64Counter for Counters: where to put it, its
// name and what it counts.
type Counter struct {
	Into        *metric.Int64Counter
	Name        string
	Description string
}

// Counters creates every counter on m, so a component's telemetry reads as
// a table of its counters rather than one error check each.
func Counters(m metric.Meter, cs ...Counter) error {
	for _, c := range cs {
		ctr, err := m.Int64Counter(c.Name, metric.WithDescription(c.Description))
		if err != nil {
			return fmt.Errorf("creating %s: %w", c.Name, err)
		}
		*c.Into = ctr
	}
	return nil
}
