package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/effectline/effectline/internal/kafka"
)

func TestWatermillLoggerIsOneLevelQuieter(t *testing.T) {
	var buf bytes.Buffer
	at := func(level slog.Level) watermill.LoggerAdapter {
		buf.Reset()
		return kafka.WatermillLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level})))
	}

	l := at(slog.LevelInfo)
	l.Info("rebalanced", nil)
	l.Debug("fetched", nil)
	l.With(watermill.LogFields{"topic": "t"}).Trace("message", watermill.LogFields{"offset": 1})
	l.Error("subscribe failed", nil, nil)
	if got := buf.String(); strings.Contains(got, "rebalanced") || strings.Contains(got, "fetched") ||
		strings.Contains(got, "message") || !strings.Contains(got, "subscribe failed") {
		t.Fatalf("at Info, watermill logged:\n%s", got)
	}

	l = at(watermill.LevelTrace)
	l.With(watermill.LogFields{"topic": "t"}).Trace("message", watermill.LogFields{"offset": 1})
	l.Info("rebalanced", nil)
	got := buf.String()
	if !strings.Contains(got, "message") || !strings.Contains(got, "topic=t") || !strings.Contains(got, "offset=1") ||
		!strings.Contains(got, "level=DEBUG msg=rebalanced") || !strings.Contains(got, "component=watermill") {
		t.Fatalf("at Trace, watermill logged:\n%s", got)
	}
}

func TestConcurrentlyHandlesEveryMessageAndFailsTheBatch(t *testing.T) {
	msgs := make([]*kafka.Message, 20)
	for i := range msgs {
		msgs[i] = &kafka.Message{Offset: int64(i)}
	}
	var seen atomic.Int64
	boom := errors.New("boom")
	h := kafka.Concurrently(func(_ context.Context, m *kafka.Message) error {
		seen.Add(1)
		if m.Offset == 7 {
			return boom
		}
		return nil
	})
	if err := h(context.Background(), msgs); !errors.Is(err, boom) {
		t.Fatalf("batch error = %v, want the failing message's", err)
	}
	if seen.Load() != int64(len(msgs)) {
		t.Fatalf("handled %d of %d messages", seen.Load(), len(msgs))
	}
	if err := h(context.Background(), msgs[:7]); err != nil {
		t.Fatalf("a batch without failures: %v", err)
	}
}
