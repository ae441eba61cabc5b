package projector_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/internal/kafka"
	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
)

// A projector replica consumes effectline.outcomes into operation_state
// until the process is interrupted; any number of replicas may run, up to
// the topic's partitions.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := store.Connect(ctx, "postgres://effectline@127.0.0.1:5432/effectline")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	p, err := projector.New(projector.Config{
		Kafka: kafka.Config{Brokers: []string{"127.0.0.1:9092"}},
		Store: store.New(pool),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Page through every escalated operation, newest first.
func ExampleReader_List() {
	ctx := context.Background()
	pool, err := store.Connect(ctx, "postgres://effectline@127.0.0.1:5432/effectline")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	r := projector.NewReader(pool)
	f := events.ListFilter{Status: events.StatusEscalated, Limit: 100}
	for {
		page, err := r.List(ctx, f)
		if err != nil {
			log.Fatal(err)
		}
		for _, s := range page.Items {
			fmt.Println(s.Key, s.Tool, s.Escalation.Reason)
		}
		if page.NextCursor == "" {
			break
		}
		f.Cursor = page.NextCursor
	}
}
