package telemetry_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/telemetry"
)

// fakeTB records Fatalf instead of ending the test.
type fakeTB struct {
	testing.TB
	fatal string
}

func (f *fakeTB) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }

func TestReceiverWaitForTimesOut(t *testing.T) {
	t.Parallel()
	recv := telemetry.NewTestReceiver(t)
	tel := setup(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": recv.Endpoint()})
	_, span := tel.TracerProvider().Tracer("test").Start(t.Context(), "only span")
	span.End()
	if err := tel.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}

	f := &fakeTB{TB: t}
	got := recv.WaitFor(f, func(s []telemetry.Span) bool { return len(s) > 1 }, 50*time.Millisecond)
	if got != nil || !strings.Contains(f.fatal, `"only span"`) {
		t.Fatalf("WaitFor returned %v, failure %q: want nil and a failure listing the span", got, f.fatal)
	}
}

func TestReceiverRejectsJSON(t *testing.T) {
	t.Parallel()
	recv := telemetry.NewTestReceiver(t)
	resp, err := http.Post(recv.Endpoint()+"/v1/traces", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("status %d, want 415", resp.StatusCode)
	}
}
