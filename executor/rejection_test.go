package executor_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
	"github.com/effectline/effectline/tool/httptool"
)

// A rejection's body is journaled on the failed attempt for the agent:
// with the args' secrets redacted where it echoes them, and capped.
func TestRejectionBodyIsJournaledRedactedAndCapped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const card = "4111111111111111"
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		if strings.HasSuffix(r.URL.Path, "/big") {
			_, _ = w.Write([]byte(`{"error":"` + strings.Repeat("x", 10<<10) + `"}`))
			return
		}
		_, _ = w.Write([]byte(`{"error":"amount exceeds order total","source":{"number":"` + card + `"}}`))
	}))
	t.Cleanup(downstream.Close)
	reg, err := httptool.Parse([]byte(`tools:
  - name: cards.charge
    effect: irreversible
    invoke: {method: POST, url: "`+downstream.URL+`/charges", timeout: 2s}
    args_schema:
      type: object
      properties:
        card: {type: string, writeOnly: true}
  - name: cards.big
    effect: irreversible
    invoke: {method: POST, url: "`+downstream.URL+`/big", timeout: 2s}
`), os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cards.charge", "cards.big"} {
		tl, _ := reg.Get(name)
		if err := e.tools.Register(tl); err != nil {
			t.Fatal(err)
		}
	}
	e.start()

	e.produce("rej-1", "cards.charge", events.Irreversible, `{"card":"`+card+`","amount":9000}`)
	op := e.waitStatus("rej-1", events.StatusFailed)
	if op.LastFailure == nil || op.LastFailure.StatusCode != 422 {
		t.Fatalf("last failure = %+v", op.LastFailure)
	}
	resp := string(op.LastFailure.Response)
	if !strings.Contains(resp, "amount exceeds order total") || strings.Contains(resp, card) || !strings.Contains(resp, tool.Redacted) {
		t.Errorf("journaled response = %s", resp)
	}
	if o := events.OutcomeOf(op); o.Next != events.StepFixArgs || !strings.Contains(o.Reason, "amount exceeds order total") {
		t.Errorf("outcome = %+v", o)
	}

	e.produce("rej-2", "cards.big", events.Irreversible, `{}`)
	op = e.waitStatus("rej-2", events.StatusFailed)
	var s string
	if op.LastFailure == nil || len(op.LastFailure.Response) > events.MaxResponseBytes ||
		json.Unmarshal(op.LastFailure.Response, &s) != nil || !strings.HasSuffix(s, "(truncated)") {
		t.Errorf("an oversized answer was journaled as %d bytes: %.80s", len(op.LastFailure.Response), op.LastFailure.Response)
	}
}
