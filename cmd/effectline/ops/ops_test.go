package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// These tests hold the command line to the API's wire format with a fake
// server; cmd/effectline's TestOps runs it against the real one.

type fakeAPI struct {
	t    *testing.T
	mu   sync.Mutex
	reqs []*http.Request
	body []string
	srv  *httptest.Server
}

func newFakeAPI(t *testing.T, h http.HandlerFunc) *fakeAPI {
	f := &fakeAPI{t: t}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, r)
		f.body = append(f.body, string(b))
		f.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) run(args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	env := map[string]string{EnvAPIURL: f.srv.URL, EnvAPIToken: "tok"}
	err = Run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb)
	return out.String(), errb.String(), err
}

func writeBody(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func TestListPagesThroughTheCursor(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/operations" || r.Header.Get("Authorization") != "Bearer tok" {
			writeBody(w, 404, `{"error":"not_found"}`)
			return
		}
		switch r.URL.Query().Get("cursor") {
		case "":
			writeBody(w, 200, `{"items":[{"operation_key":"a","status":"completed","extra":1},{"operation_key":"b"}],"next_cursor":"c1"}`)
		case "c1":
			writeBody(w, 200, `{"items":[{"operation_key":"c"}],"next_cursor":"c2"}`)
		case "c2":
			writeBody(w, 200, `{"items":[]}`)
		default:
			writeBody(w, 400, `{"error":"invalid_request","field":"cursor"}`)
		}
	})
	out, _, err := f.run("list", "--json", "--status", "completed", "--tool", "cache.set")
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	var keys []string
	for _, it := range page.Items {
		keys = append(keys, it["operation_key"].(string))
	}
	if strings.Join(keys, ",") != "a,b,c" || page.Items[0]["extra"] != 1.0 {
		t.Errorf("items %v: want a,b,c with the server's members kept", page.Items)
	}
	if len(f.reqs) != 3 {
		t.Fatalf("%d requests, want 3 pages", len(f.reqs))
	}
	q := f.reqs[0].URL.Query()
	if q.Get("status") != "completed" || q.Get("tool") != "cache.set" || q.Get("limit") != "500" {
		t.Errorf("first page query %v", q)
	}
	if q := f.reqs[2].URL.Query(); q.Get("status") != "completed" || q.Get("cursor") != "c2" {
		t.Errorf("last page query %v: the filter must travel with the cursor", q)
	}

	// --limit stops early, asks for no more than it needs, and shows no
	// more than it asked for.
	f.reqs = nil
	out, _, err = f.run("list", "--limit", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Items) != 1 || len(f.reqs) != 1 || f.reqs[0].URL.Query().Get("limit") != "1" {
		t.Errorf("--limit 1: %d items in %d requests (limit=%s)", len(page.Items), len(f.reqs), f.reqs[0].URL.Query().Get("limit"))
	}
}

func TestListRefusesACursorLoop(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		writeBody(w, 200, `{"items":[{"operation_key":"a"}],"next_cursor":"same"}`)
	})
	if _, _, err := f.run("list"); err == nil || !strings.Contains(err.Error(), "same cursor") {
		t.Errorf("err = %v, want the loop named", err)
	}
}

func TestErrorsShowTheServersAnswer(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
		want   []string
	}{
		{404, `{"error":"not_found","detail":"no operation with this key"}`, []string{"GET /v1/operations/a%2Fb", "404 Not Found", "not_found", "no operation with this key"}},
		{400, `{"error":"invalid_request","field":"action","detail":"action must be one of …"}`, []string{"400", "invalid_request (action)", "action must be"}},
		{401, `{"error":"unauthorized"}`, []string{"401", EnvAPIToken}},
		{403, `{"error":"forbidden"}`, []string{"403", "role"}},
		{502, "<html>bad gateway</html>\n", []string{"502", "<html>bad gateway</html>"}},
	} {
		f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) { writeBody(w, c.status, c.body) })
		_, _, err := f.run("show", "a/b")
		if err == nil {
			t.Errorf("%d: no error", c.status)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%d: error %q lacks %q", c.status, err, w)
			}
		}
		if !IsStatus(err, c.status) {
			t.Errorf("IsStatus(%v, %d) = false", err, c.status)
		}
	}
}

func TestShowEscapesTheKeyAsOneSegment(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		writeBody(w, 200, `{"operation_key":"wf:o 1/charge?x","status":"completed","events":[]}`)
	})
	if _, _, err := f.run("show", "wf:o 1/charge?x"); err != nil {
		t.Fatal(err)
	}
	if got := f.reqs[0].URL.EscapedPath(); got != "/v1/operations/wf:o%201%2Fcharge%3Fx" {
		t.Errorf("path %s", got)
	}
	if f.reqs[0].URL.RawQuery != "" {
		t.Errorf("the key leaked into the query: %q", f.reqs[0].URL.RawQuery)
	}
}

func TestUnreachableNamesTheVariable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	env := map[string]string{EnvAPIURL: url}
	err := Run(context.Background(), []string{"list"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
	var u *UnreachableError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), EnvAPIURL) || !strings.Contains(err.Error(), url) {
		t.Errorf("err = %v, want an UnreachableError naming %s and %s", err, EnvAPIURL, url)
	}
	// Credentials in the URL never reach the message.
	env[EnvAPIURL] = strings.Replace(url, "http://", "http://ops:hunter2@", 1)
	err = Run(context.Background(), []string{"list"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("err = %v, want one without the URL's password", err)
	}
	env[EnvAPIURL] = "127.0.0.1:8080"
	if err := Run(context.Background(), []string{"list"}, func(k string) string { return env[k] }, io.Discard, io.Discard); err == nil ||
		!strings.Contains(err.Error(), EnvAPIURL) {
		t.Errorf("a URL without a scheme: err = %v", err)
	}
}

func TestDecideSendsTheDecision(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		writeBody(w, 200, `{"operation_key":"k/1","status":"completed","outcome":{"state":"succeeded","next":"done"}}`)
	})
	out, _, err := f.run("decide", "k/1", "record_success", "--note", "seen in the PSP", "--downstream-id", "pay_9")
	if err != nil {
		t.Fatal(err)
	}
	r := f.reqs[0]
	if r.Method != http.MethodPost || r.URL.EscapedPath() != "/v1/operations/k%2F1/decisions" || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("request %s %s %s", r.Method, r.URL.EscapedPath(), r.Header.Get("Content-Type"))
	}
	if f.body[0] != `{"action":"record_success","note":"seen in the PSP","downstream_id":"pay_9"}` {
		t.Errorf("body %s", f.body[0])
	}
	if out != "decision record_success recorded on k/1: now completed (succeeded, next: done)\n" {
		t.Errorf("out %q", out)
	}
	// Without the optional members, the body has only the action, so a
	// server that knows no downstream_id accepts it.
	if _, _, err := f.run("decide", "--json", "k/1", "abandon"); err != nil {
		t.Fatal(err)
	}
	if f.body[1] != `{"action":"abandon"}` {
		t.Errorf("body %s", f.body[1])
	}
	if _, _, err := f.run("decide", "k/1"); err == nil {
		t.Errorf("decide without an action: no error")
	}
}

func TestWorkflows(t *testing.T) {
	none := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) { writeBody(w, 404, `{"error":"not_found"}`) })
	for _, args := range [][]string{{"workflows"}, {"workflows", "wf-1"}} {
		_, _, err := none.run(args...)
		if !errors.Is(err, ErrNoWorkflowAPI) || !strings.Contains(err.Error(), none.srv.URL) {
			t.Errorf("%v against a server without workflows: %v", args, err)
		}
	}

	some := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/workflows":
			writeBody(w, 200, `{"workflows":[{"workflow_id":"wf-1","workflow":"order.checkout","status":"running"}]}`)
		case "/v1/workflows/wf-1":
			writeBody(w, 200, `{"workflow_id":"wf-1","workflow":"order.checkout","status":"completed",
				"steps":[{"name":"reserve","tool":"inventory.reserve","status":"completed","operation_key":"wf:wf-1/reserve"}]}`)
		default:
			writeBody(w, 404, `{"error":"not_found","detail":"no workflow with this id"}`)
		}
	})
	out, _, err := some.run("workflows")
	if err != nil || !strings.Contains(out, "order.checkout") || !strings.Contains(out, "running") {
		t.Errorf("workflows: %v\n%s", err, out)
	}
	out, _, err = some.run("workflows", "wf-1")
	if err != nil || !strings.Contains(out, "STEP") || !strings.Contains(out, "wf:wf-1/reserve") || !strings.Contains(out, "completed") {
		t.Errorf("workflows wf-1: %v\n%s", err, out)
	}
	out, _, err = some.run("workflows", "wf-1", "--json")
	var wf Workflow
	if err != nil || json.Unmarshal([]byte(out), &wf) != nil || wf.Status != "completed" {
		t.Errorf("workflows wf-1 --json: %v\n%s", err, out)
	}
	// An unknown id on a server with workflows is that server's 404, not
	// a missing API.
	_, _, err = some.run("workflows", "wf-2")
	if err == nil || errors.Is(err, ErrNoWorkflowAPI) || !IsStatus(err, 404) {
		t.Errorf("an unknown workflow: %v", err)
	}
}

// scripted is an eventStream that answers from a script, as the poller or
// an SSE reader would.
type scripted struct {
	answers []struct {
		evs []Event
		op  Operation
	}
	afters []int64
}

func (s *scripted) next(_ context.Context, after int64) ([]Event, Operation, error) {
	s.afters = append(s.afters, after)
	if len(s.answers) == 0 {
		return nil, Operation{}, errors.New("asked past the end of the script")
	}
	a := s.answers[0]
	s.answers = s.answers[1:]
	return a.evs, a.op, nil
}

func TestWatchEndsWhenSettledAndEverythingIsPrinted(t *testing.T) {
	ev := func(seq int64) Event { return Event{Seq: seq, Type: fmt.Sprintf("e%d", seq)} }
	s := &scripted{}
	add := func(op Operation, evs ...Event) {
		s.answers = append(s.answers, struct {
			evs []Event
			op  Operation
		}{evs, op})
	}
	add(Operation{Status: "pending", Seq: 2}, ev(1), ev(2))
	add(Operation{Status: "in_progress", Seq: 3}, ev(3))
	// Settled, but the stream delivered only part of the history yet (an
	// SSE reader may): the watch goes on until it has reached the record's seq.
	add(Operation{Status: "completed", Seq: 5}, ev(4))
	add(Operation{Status: "completed", Seq: 5}, ev(5))
	var printed []int64
	op, err := watch(context.Background(), s, func(evs []Event) error {
		for _, e := range evs {
			printed = append(printed, e.Seq)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if op.Status != "completed" || fmt.Sprint(printed) != "[1 2 3 4 5]" || fmt.Sprint(s.afters) != "[0 2 3 4]" {
		t.Errorf("status %s, printed %v, asked after %v", op.Status, printed, s.afters)
	}
}

func TestParseTakesFlagsAnywhere(t *testing.T) {
	for _, c := range []struct {
		args []string
		json bool
		pos  string
	}{
		{[]string{"k", "--json"}, true, "k"},
		{[]string{"--json", "k"}, true, "k"},
		{[]string{"k"}, false, "k"},
		{[]string{"--json", "--", "-k"}, true, "-k"},
	} {
		e := &env{stderr: io.Discard}
		fs := e.flags("show")
		pos, err := parse(fs, c.args, 1, 1, "one key")
		if err != nil || e.json != c.json || strings.Join(pos, " ") != c.pos {
			t.Errorf("parse(%v) = %v, json %v, %v", c.args, pos, e.json, err)
		}
	}
	e := &env{stderr: io.Discard}
	if _, err := parse(e.flags("show"), []string{"a", "b"}, 1, 1, "one key"); err == nil {
		t.Errorf("two keys: no error")
	}
	if _, err := parse(e.flags("show"), []string{"--nope"}, 0, 1, "one key"); err == nil {
		t.Errorf("unknown flag: no error")
	}
}

func TestRunUsage(t *testing.T) {
	var out, errb bytes.Buffer
	get := func(string) string { return "" }
	if err := Run(context.Background(), nil, get, &out, &errb); err == nil || !strings.Contains(errb.String(), "Usage") {
		t.Errorf("no command: err %v, stderr %q", err, errb.String())
	}
	if err := Run(context.Background(), []string{"explode"}, get, &out, &errb); err == nil || !strings.Contains(err.Error(), "explode") {
		t.Errorf("unknown command: %v", err)
	}
	out.Reset()
	if err := Run(context.Background(), []string{"help"}, get, &out, &errb); err != nil || !strings.Contains(out.String(), "watch KEY") {
		t.Errorf("help: %v %q", err, out.String())
	}
	if err := Run(context.Background(), []string{"show", "-h"}, get, &out, &errb); err != nil {
		t.Errorf("show -h: %v, want success", err)
	}
	if err := Run(context.Background(), []string{"dlq"}, get, &out, &errb); err == nil || !strings.Contains(err.Error(), EnvKafkaBrokers) {
		t.Errorf("dlq without brokers: %v", err)
	}
}

// sseEvent is one event of a fake stream: id = seq, data = the envelope.
func sseEvent(w io.Writer, seq int64, typ string) {
	fmt.Fprintf(w, "id: %d\nevent: %s\ndata: {\"seq\":%d,\"type\":%q,\n", seq, typ, seq, typ)
	fmt.Fprintf(w, "data: \"operation_key\":\"k/1\"}\n\n")
}

func TestWatchReadsTheStreamAndResumesAfterADrop(t *testing.T) {
	var mu sync.Mutex
	var lastIDs []string
	records := 0
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.EscapedPath() {
		case "/v1/operations/k%2F1/events":
			mu.Lock()
			lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
			n := len(lastIDs)
			mu.Unlock()
			if r.Header.Get("Accept") != "text/event-stream" {
				writeBody(w, 406, `{"error":"not_acceptable"}`)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			if n == 1 {
				io.WriteString(w, ": keepalive\n\n")
				sseEvent(w, 1, "intent.recorded")
				sseEvent(w, 2, "attempt.started")
				io.WriteString(w, "id: 3\ndata: {\"seq\":3,")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler) // the connection drops mid-event
			}
			sseEvent(w, 3, "attempt.failed")
			sseEvent(w, 4, "attempt.succeeded")
		case "/v1/operations/k%2F1":
			mu.Lock()
			records++
			mu.Unlock()
			writeBody(w, 200, `{"operation_key":"k/1","status":"completed","seq":4,"outcome":{"state":"succeeded","next":"done"},
				"events":[{"seq":1,"type":"intent.recorded"},{"seq":2,"type":"attempt.started"},{"seq":3,"type":"attempt.failed"},{"seq":4,"type":"attempt.succeeded"}]}`)
		default:
			writeBody(w, 404, `{"error":"not_found"}`)
		}
	})
	out, _, err := f.run("watch", "k/1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var seqs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.OperationKey != "k/1" {
			t.Fatalf("line %q: %v", line, err)
		}
		seqs = append(seqs, fmt.Sprint(ev.Seq))
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(seqs, " ") != "1 2 3 4" {
		t.Errorf("printed %v, want every event once, in order\n%s", seqs, out)
	}
	// Reopened after the last whole event; the record read once, at the end.
	if fmt.Sprint(lastIDs) != "[ 2]" || records != 1 {
		t.Errorf("streams opened with Last-Event-ID %q, %d reads of the record: want [ 2] and 1", lastIDs, records)
	}
}

func TestWatchPollsAServerWithoutTheStream(t *testing.T) {
	for _, status := range []int{404, 406} {
		polls := 0
		f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.EscapedPath() {
			case "/v1/operations/k/events":
				w.WriteHeader(status)
				io.WriteString(w, "404 page not found\n")
			case "/v1/operations/k":
				polls++
				if polls == 1 {
					writeBody(w, 200, `{"operation_key":"k","status":"in_progress","seq":1,"events":[{"seq":1,"type":"intent.recorded"}]}`)
					return
				}
				writeBody(w, 200, `{"operation_key":"k","status":"completed","seq":2,"events":[{"seq":1,"type":"intent.recorded"},{"seq":2,"type":"attempt.succeeded"}]}`)
			}
		})
		out, _, err := f.run("watch", "k")
		if err != nil || !strings.Contains(out, "intent.recorded") || !strings.Contains(out, "attempt.succeeded") ||
			!strings.Contains(out, "settled: completed") || polls != 2 {
			t.Errorf("%d on the stream: %v, %d polls\n%s", status, err, polls, out)
		}
	}
	// An unknown key: the stream's 404, then the record's, which is shown.
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		writeBody(w, 404, `{"error":"not_found","detail":"no operation with this key"}`)
	})
	if _, _, err := f.run("watch", "nope"); !IsStatus(err, 404) || !strings.Contains(err.Error(), "GET /v1/operations/nope:") {
		t.Errorf("watch of an unknown key: %v", err)
	}
}
