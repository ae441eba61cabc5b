package ui_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/effectline/effectline/api/ui"
	"github.com/effectline/effectline/events"
)

// TestUIUnknownIrreversibleProposesCheckingTheDownstream: for a payment of
// unknown outcome the page proposes checking the downstream, not a retry; a
// retry needs a note and the confirmation, and the panel shows the latest
// evidence with its time.
func TestUIUnknownIrreversibleProposesCheckingTheDownstream(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t, openMode)
	const key = "order-9/charge"
	op := inProgress(t, f.store, key, "payments.charge", events.Irreversible, secretArgs)
	journal(t, f.store, op, key, "payments.charge", events.Irreversible,
		ev{events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout_after_send", Next: events.NextReconcile,
			Precondition: json.RawMessage(`{"check":"precondition","verdict":"passed","body":{"order":"paid-and-open"}}`)}},
		ev{events.OperationEscalated, 0, events.EscalationData{Reason: "cannot_tell", Request: json.RawMessage(`{}`),
			ProposedAction: events.ActionRetry}})
	b := newBrowser(t, f)
	html := page(t, b.get(t, ui.OperationHref(key)))
	for _, want := range []string{"check the downstream", `name="confirm_retry"`, "Retry anyway", "paid-and-open", "As of ",
		"Asked again as this page opened", "it cannot tell"} {
		if !strings.Contains(html, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	if strings.Contains(html, "(proposed)") {
		t.Error("a button is proposed for an irreversible effect of unknown outcome")
	}
	if q := page(t, b.get(t, "/ui/")); !strings.Contains(q, "check the downstream") {
		t.Error("the queue does not propose checking the downstream")
	}
	csrf := csrfOf(t, html)
	n := f.countEvents(t, key)
	for name, form := range map[string]url.Values{
		"no note":         decisionForm(csrf, events.ActionRetry, ""),
		"no confirmation": decisionForm(csrf, events.ActionRetry, "PSP shows nothing"),
	} {
		wantRedirect(t, b.post(t, ui.OperationHref(key)+"/decisions", form), ui.OperationHref(key))
		if m := f.countEvents(t, key); m != n {
			t.Fatalf("%s: a retry was journaled", name)
		}
		if page := page(t, b.get(t, ui.OperationHref(key))); !strings.Contains(page, "Not recorded: ") {
			t.Errorf("%s: no refusal shown", name)
		}
	}
	form := decisionForm(csrf, events.ActionRetry, "PSP shows nothing")
	form.Set("confirm_retry", "yes")
	wantRedirect(t, b.post(t, ui.OperationHref(key)+"/decisions", form), ui.OperationHref(key))
	if op := load(t, f.store, key); op.Status != events.StatusPending {
		t.Fatalf("after a confirmed retry: %s", op.Status)
	}
}

// TestUIApprovalGateSaysWhatWillRun: an approval_required item says why it
// waits, how many approvers it needs, and what approving runs.
func TestUIApprovalGateSaysWhatWillRun(t *testing.T) {
	t.Parallel()
	f, _ := setupApproval(t, openMode)
	const key = "payout-1"
	journal(t, f.store, events.Operation{}, key, "payments.charge", events.Irreversible,
		ev{events.IntentRecorded, 0, events.IntentData{Args: json.RawMessage(secretArgs), Principal: "billing-agent"}},
		ev{events.OperationEscalated, 0, events.EscalationData{Reason: events.ReasonApprovalRequired,
			Request: json.RawMessage(`{}`), ProposedAction: events.ActionRetry, Approvers: 2}})
	b := newBrowser(t, f)
	html := page(t, b.get(t, ui.OperationHref(key)))
	for _, want := range []string{"2 distinct approvers must decide retry, 0 so far", "Approving (retry) sends the first attempt",
		"under downstream key payout-1", "(proposed)"} {
		if !strings.Contains(html, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	if q := page(t, b.get(t, "/ui/")); !strings.Contains(q, "2 distinct approvers") {
		t.Error("the queue does not say why it waits")
	}
}
