package telemetry_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/effectline/effectline/internal/telemetry"
)

// Setup is called once, in cmd; components get the providers and the
// logger, and Shutdown flushes the last spans on the way out.
func ExampleSetup() {
	ctx := context.Background()
	tel, err := telemetry.Setup(ctx, telemetry.Config{
		ServiceName:    "effectline",
		ServiceVersion: "v0.1.0",
		Getenv:         os.Getenv, // OTEL_EXPORTER_OTLP_ENDPOINT etc.
		LogWriter:      os.Stderr,
		LogLevel:       "info",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(ctx); err != nil {
			tel.Logger().ErrorContext(ctx, "flushing telemetry", "error", err)
		}
	}()

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.MetricsHandler())
	_ = &http.Server{Addr: "127.0.0.1:9464", Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	// Pass tel.TracerProvider(), tel.MeterProvider() and tel.Logger() to
	// the components (they also default to the otel globals Setup set).
	tel.Logger().InfoContext(ctx, "started")
}
