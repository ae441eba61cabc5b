package api

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/watch"
)

// withHub runs a hub for the server. sweep is the safety net's interval;
// an hour leaves waking to the events the test delivers.
func withHub(t *testing.T, sweep time.Duration, out **watch.Hub, stop *context.CancelFunc) option {
	return func(_ *Config, d *Deps) {
		h, err := watch.New(watch.Config{Loader: d.Store, SweepInterval: sweep})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = h.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		d.Waits = h
		*out = h
		if stop != nil {
			*stop = cancel
		}
	}
}

// settle journals the rest of key's first attempt and delivers each event
// to the hub, as the relay and the Kafka tail would.
func settle(t *testing.T, st *store.Store, hub *watch.Hub, key string, after ...ev) {
	t.Helper()
	// A waiting POST registers its wait before it journals the intent:
	// the intent may still be committing.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := st.Load(context.Background(), key); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	op := load(t, st, key)
	steps := append([]ev{{events.AttemptStarted, 1, events.AttemptStartedData{DownstreamKey: key, Worker: "w",
		LeaseUntil: time.Now().Add(time.Minute)}}}, after...)
	next := journal(t, st, op, key, op.Tool, op.EffectClass, steps...)
	if hub == nil {
		return
	}
	stored, err := st.Events(context.Background(), key, op.Seq)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range stored {
		hub.Deliver(key, e.Raw)
	}
	_ = next
}

// waitForWaiters polls until n requests wait in hub.
func waitForWaiters(t *testing.T, hub *watch.Hub, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for hub.Waiting() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", hub.Waiting(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func outcomeOf(t *testing.T, r response) events.OperationOutcome {
	t.Helper()
	var rec struct {
		Outcome events.OperationOutcome `json:"outcome"`
	}
	if err := json.Unmarshal(r.body, &rec); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	return rec.Outcome
}

func TestPreferWaitAnswersOnceSettled(t *testing.T) {
	var hub *watch.Hub
	f := setup(t, withHub(t, time.Hour, &hub, nil))
	const key = "order-10/charge"
	answered := make(chan response, 1)
	go func() { answered <- f.post(t, billingToken, key, "payments.charge", chargeArgs, "Prefer", "wait=30") }()
	waitForWaiters(t, hub, 1)
	settle(t, f.store, hub, key, ev{events.AttemptFailed, 1, events.AttemptFailedData{Kind: events.Final,
		ErrorClass: "http_422", StatusCode: 422, Response: json.RawMessage(`{"error":"amount exceeds order total"}`)}})
	r := <-answered
	wantStatus(t, r, http.StatusOK)
	if got := r.header.Get("Preference-Applied"); got != "wait=30" {
		t.Errorf("Preference-Applied = %q", got)
	}
	if o := outcomeOf(t, r); o.State != events.StateFailed || !strings.Contains(o.Reason, "amount exceeds order total") {
		t.Errorf("outcome = %+v", o)
	}
}

func TestPreferWaitAnswers202AtItsDeadline(t *testing.T) {
	var hub *watch.Hub
	f := setup(t, withHub(t, 50*time.Millisecond, &hub, nil))
	r := f.post(t, billingToken, "order-11/charge", "payments.charge", chargeArgs, "Prefer", "respond-async, wait=1")
	wantStatus(t, r, http.StatusAccepted)
	if o := outcomeOf(t, r); o.State != events.StatePending || o.Next != events.StepWait {
		t.Errorf("outcome = %+v", o)
	}
	if r.header.Get("Preference-Applied") != "wait=1" || r.header.Get("Location") == "" {
		t.Errorf("headers = %v", r.header)
	}
	if hub.Waiting() != 0 {
		t.Errorf("%d waiters left registered", hub.Waiting())
	}
}

// The sweep alone wakes a waiter whose events never reach the hub.
func TestGetWaitWokenByTheSweep(t *testing.T) {
	var hub *watch.Hub
	f := setup(t, withHub(t, 50*time.Millisecond, &hub, nil))
	const key = "order-12/charge"
	wantStatus(t, f.post(t, billingToken, key, "payments.charge", chargeArgs), http.StatusAccepted)
	answered := make(chan response, 1)
	go func() { answered <- f.do(t, http.MethodGet, operationHref(key)+"?wait=30s", billingToken, "") }()
	waitForWaiters(t, hub, 1)
	settle(t, f.store, nil, key, ev{events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout_after_send", Next: events.NextReconcile}})
	r := <-answered
	wantStatus(t, r, http.StatusOK)
	if o := outcomeOf(t, r); o.State != events.StateUnknown || o.Next != events.StepAskHuman {
		t.Errorf("outcome = %+v", o)
	}
	wantError(t, f.do(t, http.MethodGet, operationHref(key)+"?wait=soon", billingToken, ""), http.StatusBadRequest, codeInvalidRequest)
	wantStatus(t, f.do(t, http.MethodGet, operationHref("order-13/none")+"?wait=1s", billingToken, ""), http.StatusNotFound)
}

func TestGetWaitAnswers202WhenNotSettled(t *testing.T) {
	var hub *watch.Hub
	f := setup(t, withHub(t, time.Hour, &hub, nil))
	const key = "order-14/charge"
	wantStatus(t, f.post(t, billingToken, key, "payments.charge", chargeArgs), http.StatusAccepted)
	r := f.do(t, http.MethodGet, operationHref(key)+"?wait=1", billingToken, "")
	wantStatus(t, r, http.StatusAccepted)
	if o := outcomeOf(t, r); o.State != events.StatePending {
		t.Errorf("outcome = %+v", o)
	}
}

// Shutting the hub down answers every waiter at once with its record.
func TestWaitersReleasedOnShutdown(t *testing.T) {
	var hub *watch.Hub
	var stop context.CancelFunc
	f := setup(t, withHub(t, time.Hour, &hub, &stop))
	const n = 20
	answered := make(chan response, n)
	for i := range n {
		key := "order-15/charge-" + string(rune('a'+i))
		go func() { answered <- f.post(t, billingToken, key, "payments.charge", chargeArgs, "Prefer", "wait=60") }()
	}
	waitForWaiters(t, hub, n)
	stop()
	deadline := time.After(45 * time.Second) // far below the 60 s wait: released, not timed out
	for range n {
		select {
		case r := <-answered:
			wantStatus(t, r, http.StatusAccepted)
			if o := outcomeOf(t, r); o.State != events.StatePending {
				t.Errorf("released outcome = %+v", o)
			}
		case <-deadline:
			t.Fatal("a waiter was not released at shutdown")
		}
	}
	// A wait asked for after the release answers at once.
	wantStatus(t, f.post(t, billingToken, "order-15/late", "payments.charge", chargeArgs, "Prefer", "wait=60"), http.StatusAccepted)
}

type sseEvent struct {
	id, typ string
	data    string
}

// readSSE reads events until the stream ends.
func readSSE(t *testing.T, body io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.id != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.typ = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
		}
	}
	return out
}

func TestEventStreamEndsOnceSettledAndResumes(t *testing.T) {
	var hub *watch.Hub
	f := setup(t, withHub(t, time.Hour, &hub, nil))
	const key = "order-16/charge"
	wantStatus(t, f.post(t, billingToken, key, "payments.charge", chargeArgs), http.StatusAccepted)

	req, _ := http.NewRequest(http.MethodGet, f.url+operationHref(key)+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+billingToken)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	observe(http.MethodGet, "/v1/operations/{key}/events", res.StatusCode)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream answered %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	got := make(chan []sseEvent, 1)
	go func() { got <- readSSE(t, res.Body) }()
	waitForWaiters(t, hub, 1)
	settle(t, f.store, hub, key, ev{events.AttemptSucceeded, 1, events.AttemptSucceededData{StatusCode: 201, Result: json.RawMessage(`{"id":"ch_16"}`)}})
	evs := <-got
	var types []string
	for i, e := range evs {
		types = append(types, e.typ)
		if e.id != string(rune('1'+i)) {
			t.Errorf("event %d has id %s", i, e.id)
		}
	}
	if strings.Join(types, ",") != "intent.recorded,attempt.started,attempt.succeeded" {
		t.Fatalf("streamed %v", types)
	}

	// Resuming after the second event sends the third only, and ends.
	req.Header.Set("Last-Event-ID", "2")
	res2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res2.Body.Close()
	if evs := readSSE(t, res2.Body); len(evs) != 1 || evs[0].id != "3" || !strings.Contains(evs[0].data, "ch_16") {
		t.Errorf("resumed stream = %+v", evs)
	}
	wantStatus(t, f.do(t, http.MethodGet, operationHref("order-16/none")+"/events", billingToken, ""), http.StatusNotFound)
	wantError(t, f.do(t, http.MethodGet, operationHref(key)+"/events", billingToken, "", "Last-Event-ID", "x"),
		http.StatusBadRequest, codeInvalidRequest)
}

func TestPreferWaitParsing(t *testing.T) {
	for h, want := range map[string]time.Duration{
		"wait=5": 5 * time.Second, "respond-async, wait=10": 10 * time.Second, "WAIT = 3": 3 * time.Second,
		"wait=600": MaxWait, "wait=0": 0, `wait="2"`: 2 * time.Second,
	} {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Prefer", h)
		if d, ok := preferWait(r); !ok || d != want {
			t.Errorf("Prefer: %s = %v %t, want %v", h, d, ok, want)
		}
	}
	for _, h := range []string{"", "respond-async", "wait=-1", "wait=soon"} {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Prefer", h)
		if d, ok := preferWait(r); ok {
			t.Errorf("Prefer: %s applied as %v", h, d)
		}
	}
}
