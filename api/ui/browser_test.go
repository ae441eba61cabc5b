package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/css"
	"github.com/chromedp/chromedp"

	"github.com/effectline/effectline/api"
	"github.com/effectline/effectline/api/ui"
	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/workflow"
)

// TestUIInBrowser drives the approval UI in headless Chromium, as an
// approver would: sign in with a token, find the escalated operation in the
// queue, record success with the form's button, and see it completed. It is
// the one test that proves the pages work in a browser under their own
// Content-Security-Policy (no script, no inline style), with the real
// cookie and CSRF handling, against a server started with Run.
//
// It needs Debian's chromium (apt-get install chromium; .ci/run installs
// it). Without it the test fails rather than skips, so a green build always
// means the UI was exercised. Screenshots go to $EFFECTLINE_TEST_ARTIFACTS
// (default: the test's temporary directory), never into the repository.
func TestUIInBrowser(t *testing.T) {
	chromium := findChromium(t)

	var cfg api.Config
	var deps api.Deps
	var svc *workflow.Service
	f, _ := setupApproval(t, withWorkflows(t, &svc), func(c *api.Config, d *api.Deps) { cfg, deps = *c, *d })
	const key = "order-9/charge"
	escalated(t, f.store, key, "payments.charge", events.Irreversible, secretArgs)
	const run = "gift-9"
	escalatedWorkflow(t, f, svc, run)

	base := startServer(t, cfg, deps)

	ctx, cancelTest := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancelTest)
	var chromiumOut syncBuffer
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 1000),
		chromedp.CombinedOutput(&chromiumOut),
	)
	browserCtx, cancelBrowser := chromedp.NewContext(allocCtx)
	// Registered after TempDir, so it runs first: the browser has exited
	// before its profile directory is removed.
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chromium output:\n%s", chromiumOut.String())
		}
	})
	artifacts := artifactsDir(t)

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	location := func() string {
		t.Helper()
		loc, err := chromedp.Run(browserCtx, chromedp.Location())
		must("reading the location", err)
		return loc
	}
	pageHTML := func() string {
		t.Helper()
		html, err := chromedp.Run(browserCtx, chromedp.OuterHTML(chromedp.CSS("html")))
		must("reading the page", err)
		return html
	}
	screenshot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(browserCtx, chromedp.FullScreenshot(100))
		must("taking a screenshot", err)
		path := filepath.Join(artifacts, name)
		must("saving a screenshot", os.WriteFile(path, png, 0o644))
		t.Logf("screenshot: %s", path)
	}

	// Not signed in: the queue sends to the sign-in form.
	must("opening the queue", chromedp.Do(browserCtx, chromedp.Navigate(base+"/ui/")))
	if loc := location(); !strings.HasPrefix(loc, base+"/ui/login") {
		t.Fatalf("not signed in, the queue is at %s", loc)
	}
	must("typing the token", chromedp.Do(browserCtx, chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), opsToken)))
	res, err := chromedp.RunResponse(browserCtx, chromedp.Click(chromedp.CSS(`form.login button[type="submit"]`)))
	must("signing in", err)
	if res.Status != http.StatusOK || location() != base+"/ui/" {
		t.Fatalf("after signing in: %d at %s", res.Status, location())
	}

	// The queue lists the operation, without its secrets.
	card := `li.card[data-key="` + key + `"]`
	must("finding the operation in the queue", chromedp.Do(browserCtx, chromedp.WaitVisible(chromedp.CSS(card))))
	text, err := chromedp.Run(browserCtx, chromedp.Text(chromedp.CSS(card)))
	must("reading the card", err)
	for _, want := range []string{key, "payments.charge", "irreversible", "escalated", "absent_downstream", "Record success"} {
		if !strings.Contains(text, want) {
			t.Errorf("the card does not show %q: %s", want, text)
		}
	}
	if html := pageHTML(); strings.Contains(html, secretCard) || strings.Contains(html, secretCVV) {
		t.Fatal("a secret arg reached the queue")
	}
	// The stylesheet loaded despite the CSP: the proposed action's button is
	// styled as the primary one.
	styles, err := chromedp.Run(browserCtx, chromedp.ComputedStyle(chromedp.CSS(card+` button[value="retry"]`)))
	must("reading a button's style", err)
	if bg := computed(styles, "background-color"); bg == "" || bg == "rgb(255, 255, 255)" || bg == "rgba(0, 0, 0, 0)" {
		t.Errorf("the proposed action's button is not styled (background %q): the stylesheet did not load", bg)
	}
	screenshot("ui-queue.png")

	// The operation's page shows the evidence.
	must("opening the operation", chromedp.Do(browserCtx, chromedp.Click(chromedp.CSS(card+` a.key`)),
		chromedp.WaitVisible(chromedp.CSS(`section.panel pre.json`))))
	if html := pageHTML(); !strings.Contains(html, "no charge for this key") || strings.Contains(html, secretCard) {
		t.Fatal("the operation's page does not show what the downstream showed, or shows a secret")
	}
	screenshot("ui-operation.png")
	must("going back to the queue", chromedp.Do(browserCtx, chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS(card))))

	// Record success with the card's button.
	must("typing a note", chromedp.Do(browserCtx, chromedp.SendKeys(chromedp.CSS(card+` input[name="note"]`), "charge visible in the PSP")))
	res, err = chromedp.RunResponse(browserCtx, chromedp.Click(chromedp.CSS(card+` button[value="record_success"]`)))
	must("recording success", err)
	if res.Status != http.StatusOK {
		t.Fatalf("the decision's page answered %d", res.Status)
	}
	if loc := location(); loc != base+ui.OperationHref(key) {
		t.Fatalf("after the decision the browser is at %s", loc)
	}
	status, err := chromedp.Run(browserCtx, chromedp.Text(chromedp.CSS(`.status`)))
	must("reading the status", err)
	flash, err := chromedp.Run(browserCtx, chromedp.Text(chromedp.CSS(`.flash`)))
	must("reading the message", err)
	if status != "completed" || !strings.Contains(flash, "Recorded record_success") {
		t.Fatalf("after the decision: status %q, message %q", status, flash)
	}
	if html := pageHTML(); strings.Contains(html, secretCard) || strings.Contains(html, secretCVV) {
		t.Fatal("a secret arg reached the operation's page")
	}
	screenshot("ui-decided.png")

	op := load(t, f.store, key)
	if op.Status != events.StatusCompleted {
		t.Fatalf("stored status %s", op.Status)
	}
	if d := lastDecision(t, f.store, key); d.Approver != "ops" || d.Note != "charge visible in the PSP" {
		t.Fatalf("decision %+v", d)
	}

	// The escalated workflow: from its card to its page, and abandoned with
	// the run's own decision button.
	wcard := `li.card[data-workflow="` + run + `"]`
	must("reopening the queue for the workflow", chromedp.Do(browserCtx, chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS(wcard))))
	must("opening the workflow", chromedp.Do(browserCtx, chromedp.Click(chromedp.CSS(wcard+` a.key`)),
		chromedp.WaitVisible(chromedp.CSS(`table.steps`))))
	if loc := location(); loc != base+ui.WorkflowHref(run) {
		t.Fatalf("the workflow's card leads to %s", loc)
	}
	screenshot("ui-workflow.png")
	res, err = chromedp.RunResponse(browserCtx, chromedp.Click(chromedp.CSS(`button[value="abandon"]`)))
	must("abandoning the workflow", err)
	if res.Status != http.StatusOK || location() != base+ui.WorkflowHref(run) {
		t.Fatalf("after the workflow decision: %d at %s", res.Status, location())
	}
	flash, err = chromedp.Run(browserCtx, chromedp.Text(chromedp.CSS(`.flash`)))
	must("reading the workflow's message", err)
	if !strings.Contains(flash, "Recorded abandon on workflow "+run) {
		t.Fatalf("after the workflow decision: message %q", flash)
	}
	if rec, err := svc.Get(ctx, run); err != nil || rec.Status != events.WorkflowAbandoned {
		t.Fatalf("stored run %s, %v; want abandoned", rec.Status, err)
	}

	// The queue is empty now.
	must("reopening the queue", chromedp.Do(browserCtx, chromedp.Navigate(base+"/ui/")))
	if html := pageHTML(); !strings.Contains(html, "Nothing is waiting for a decision") {
		t.Fatal("the decided operation is still in the queue")
	}

	// The guards' pages. An irreversible charge of unknown outcome proposes
	// checking the downstream (asked again as the page opens), and a retry
	// without the confirmation ticked is not recorded.
	const unknownKey = "order-10/charge"
	op = inProgress(t, f.store, unknownKey, "payments.charge", events.Irreversible, secretArgs)
	journal(t, f.store, op, unknownKey, "payments.charge", events.Irreversible,
		ev{events.AttemptUnknown, 1, events.AttemptUnknownData{ErrorClass: "timeout_after_send", Next: events.NextReconcile}},
		ev{events.OperationEscalated, 0, events.EscalationData{Reason: "cannot_tell", Request: json.RawMessage(`{}`),
			ProposedAction: events.ActionRetry}})
	must("opening the charge of unknown outcome", chromedp.Do(browserCtx, chromedp.Navigate(base+ui.OperationHref(unknownKey)),
		chromedp.WaitVisible(chromedp.CSS(`input[name="confirm_retry"]`))))
	if html := pageHTML(); !strings.Contains(html, "check the downstream") || !strings.Contains(html, "Asked again as this page opened") {
		screenshot("ui-unknown-irreversible.png")
		t.Fatal("the page of an irreversible charge of unknown outcome does not propose checking the downstream")
	}
	screenshot("ui-unknown-irreversible.png")
	must("typing a note", chromedp.Do(browserCtx, chromedp.SendKeys(chromedp.CSS(`input[name="note"]`), "PSP shows nothing")))
	_, err = chromedp.RunResponse(browserCtx, chromedp.Click(chromedp.CSS(`button[value="retry"]`)))
	must("retrying without the confirmation", err)
	flash, err = chromedp.Run(browserCtx, chromedp.Text(chromedp.CSS(`.flash`)))
	must("reading the message", err)
	if !strings.Contains(flash, "Not recorded") || load(t, f.store, unknownKey).Status != events.StatusEscalated {
		screenshot("ui-retry-unconfirmed.png")
		t.Fatalf("a retry without the confirmation: message %q, status %s", flash, load(t, f.store, unknownKey).Status)
	}

	// An operation in the approval gate says why it waits and what runs.
	const gateKey = "payout-2"
	journal(t, f.store, events.Operation{}, gateKey, "payments.charge", events.Irreversible,
		ev{events.IntentRecorded, 0, events.IntentData{Args: json.RawMessage(secretArgs), Principal: "billing-agent"}},
		ev{events.OperationEscalated, 0, events.EscalationData{Reason: events.ReasonApprovalRequired,
			Request: json.RawMessage(`{}`), ProposedAction: events.ActionRetry, Approvers: 2}})
	must("opening the approval gate", chromedp.Do(browserCtx, chromedp.Navigate(base+ui.OperationHref(gateKey)),
		chromedp.WaitVisible(chromedp.CSS(`p.will-run`))))
	if html := pageHTML(); !strings.Contains(html, "2 distinct approvers must decide retry") {
		screenshot("ui-approval-gate.png")
		t.Fatal("the approval gate's page does not say how many approvers it needs")
	}
	screenshot("ui-approval-gate.png")
}

// findChromium returns Debian's chromium, failing the test (not skipping
// it) with how to install it.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "/usr/bin/chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Fatal("the approval UI's browser test needs Chromium: install it with " +
		"`apt-get update && apt-get install -y chromium` (Debian; .ci/run does this)")
	return ""
}

// startServer runs a server with cfg and deps on a free port of 127.0.0.1,
// with Run as in production, and returns its base URL.
func startServer(t *testing.T, cfg api.Config, deps api.Deps) string {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	srv, err := api.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return "http://" + srv.Addr()
}

// artifactsDir is where screenshots go: $EFFECTLINE_TEST_ARTIFACTS, or the
// test's temporary directory.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("EFFECTLINE_TEST_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func computed(styles []*css.ComputedStyleProperty, name string) string {
	for _, s := range styles {
		if s.Name == name {
			return s.Value
		}
	}
	return ""
}

// syncBuffer collects the browser's output, written from its own goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 {
		return len(p), nil // enough to diagnose; the rest is noise
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
