package kafka_test

import (
	"bytes"
	"log/slog"
	"strings"
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
