package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/effectline/effectline/events"
)

// signed returns the Standard Webhooks headers of body, signed with secret
// at ts, as the header list fixture.do takes.
func signed(t testing.TB, secret, id string, ts time.Time, body string) []string {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := wh.Sign(id, ts, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return []string{
		standardwebhooks.HeaderWebhookID, id,
		standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10),
		standardwebhooks.HeaderWebhookSignature, sig,
	}
}

func successCallback(key string) string {
	return `{"type": "effect.succeeded", "idempotency_key": "` + key + `", "downstream_id": "ch_42", "result": {"charge_id": "ch_42"}}`
}

type webhookAnswer struct {
	Status          string `json:"status"`
	OperationKey    string `json:"operation_key"`
	OperationStatus string `json:"operation_status"`
	Reason          string `json:"reason"`
}

func decodeWebhook(t testing.TB, r response) webhookAnswer {
	t.Helper()
	wantStatus(t, r, http.StatusOK)
	var a webhookAnswer
	if err := json.Unmarshal(r.body, &a); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	return a
}

// A verified success callback settles an attempt whose outcome is open;
// the same delivery again changes nothing.
func TestWebhookResolvesInProgressOperationOnce(t *testing.T) {
	t.Parallel()
	f, a := setupApproval(t)
	const key = "order-7/charge"
	inProgress(t, f.store, key, "payments.charge", events.Irreversible, secretArgs)
	body := successCallback(key)
	headers := signed(t, a.secret, "msg_1", time.Now(), body)

	got := decodeWebhook(t, f.do(t, http.MethodPost, "/v1/webhooks/payments.charge", "", body, headers...))
	if got != (webhookAnswer{Status: "applied", OperationKey: key, OperationStatus: "completed"}) {
		t.Fatalf("first delivery: %+v", got)
	}
	op := load(t, f.store, key)
	if op.Status != events.StatusCompleted || op.DownstreamID != "ch_42" || !strings.Contains(string(op.Result), "ch_42") {
		t.Fatalf("operation after the callback: %s %s %s", op.Status, op.DownstreamID, op.Result)
	}
	n := f.countEvents(t, key)

	// The sender did not see the 200 and redelivers: one state change.
	got = decodeWebhook(t, f.do(t, http.MethodPost, "/v1/webhooks/payments.charge", "", body, headers...))
	if got.Status != "duplicate" {
		t.Fatalf("redelivery: %+v", got)
	}
	if m := f.countEvents(t, key); m != n {
		t.Fatalf("a redelivery appended %d events", m-n)
	}
	// A new delivery id with the same news changes nothing either.
	got = decodeWebhook(t, f.do(t, http.MethodPost, "/v1/webhooks/payments.charge", "", body,
		signed(t, a.secret, "msg_2", time.Now(), body)...))
	if got != (webhookAnswer{Status: "ignored", OperationKey: key, OperationStatus: "completed", Reason: "already_completed"}) {
		t.Fatalf("second delivery: %+v", got)
	}
	if m := f.countEvents(t, key); m != n {
		t.Fatalf("a repeated callback appended %d events", m-n)
	}
}

func TestWebhookRefusals(t *testing.T) {
	t.Parallel()
	f, a := setupApproval(t, func(c *Config, _ *Deps) { c.MaxBodyBytes = 4 << 10 })
	const key = "k"
	inProgress(t, f.store, key, "payments.charge", events.Irreversible, secretArgs)
	body := successCallback(key)
	const path = "/v1/webhooks/payments.charge"

	t.Run("forged signature", func(t *testing.T) {
		h := signed(t, newWebhookSecret(t), "forged_1", time.Now(), body)
		wantError(t, f.do(t, http.MethodPost, path, "", body, h...), http.StatusUnauthorized, codeInvalidSignature)
	})
	t.Run("body changed after signing", func(t *testing.T) {
		h := signed(t, a.secret, "tampered_1", time.Now(), body)
		tampered := strings.Replace(body, "ch_42", "ch_43", 1)
		wantError(t, f.do(t, http.MethodPost, path, "", tampered, h...), http.StatusUnauthorized, codeInvalidSignature)
	})
	t.Run("no signature headers", func(t *testing.T) {
		wantError(t, f.do(t, http.MethodPost, path, "", body), http.StatusUnauthorized, codeInvalidSignature)
	})
	t.Run("stale timestamp", func(t *testing.T) {
		// Correctly signed, but ten minutes ago: a replay of a captured
		// delivery looks like this.
		h := signed(t, a.secret, "stale_1", time.Now().Add(-10*time.Minute), body)
		m := wantError(t, f.do(t, http.MethodPost, path, "", body, h...), http.StatusUnauthorized, codeInvalidSignature)
		if !strings.Contains(m["detail"].(string), "timestamp") {
			t.Fatalf("401 for a stale timestamp does not say so: %v", m)
		}
	})
	t.Run("unknown source", func(t *testing.T) {
		h := signed(t, a.secret, "unknown_1", time.Now(), body)
		wantError(t, f.do(t, http.MethodPost, "/v1/webhooks/payments.refund", "", body, h...), http.StatusNotFound, codeUnknownSource)
	})
	t.Run("source without a signing secret", func(t *testing.T) {
		h := signed(t, a.secret, "unsigned_1", time.Now(), body)
		wantError(t, f.do(t, http.MethodPost, "/v1/webhooks/tickets.set", "", body, h...), http.StatusNotFound, codeUnknownSource)
	})
	t.Run("invalid payload", func(t *testing.T) {
		const junk = `{"type": "effect.succeeded"}`
		h := signed(t, a.secret, "junk_1", time.Now(), junk)
		wantError(t, f.do(t, http.MethodPost, path, "", junk, h...), http.StatusBadRequest, codeInvalidPayload)
		const notJSON = `charge done`
		h = signed(t, a.secret, "junk_2", time.Now(), notJSON)
		wantError(t, f.do(t, http.MethodPost, path, "", notJSON, h...), http.StatusBadRequest, codeInvalidPayload)
	})
	t.Run("too large", func(t *testing.T) {
		big := `{"type": "effect.succeeded", "idempotency_key": "k", "pad": "` + strings.Repeat("x", 5000) + `"}`
		h := signed(t, a.secret, "big_1", time.Now(), big)
		wantError(t, f.do(t, http.MethodPost, path, "", big, h...), http.StatusRequestEntityTooLarge, codePayloadTooLarge)
	})
	// None of them touched the operation.
	if op := load(t, f.store, key); op.Status != events.StatusInProgress {
		t.Fatalf("status %s after refused deliveries", op.Status)
	}

	// A refused delivery is not remembered: the genuine one with the same
	// id is processed.
	h := signed(t, a.secret, "forged_1", time.Now(), body)
	if got := decodeWebhook(t, f.do(t, http.MethodPost, path, "", body, h...)); got.Status != "applied" {
		t.Fatalf("genuine delivery after a forged one: %+v", got)
	}
}

func TestWebhookForAnUnknownOperationIsIgnored(t *testing.T) {
	t.Parallel()
	f, a := setupApproval(t)
	body := successCallback("never-seen")
	got := decodeWebhook(t, f.do(t, http.MethodPost, "/v1/webhooks/payments.charge", "", body,
		signed(t, a.secret, "msg_x", time.Now(), body)...))
	if got != (webhookAnswer{Status: "ignored", Reason: "unknown_operation"}) {
		t.Fatalf("answer %+v", got)
	}
}

func TestWebhookFailures(t *testing.T) {
	t.Parallel()
	// Without a handler the route says so.
	f := setup(t)
	wantError(t, f.do(t, http.MethodPost, "/v1/webhooks/payments.charge", "", `{}`), http.StatusServiceUnavailable, codeUnavailable)

	fail := make(chan error, 1)
	f = setup(t, func(_ *Config, d *Deps) {
		d.Webhooks = WebhookHandlerFunc(func(context.Context, string, http.Header, []byte, time.Time) (events.WebhookResult, error) {
			return events.WebhookResult{}, <-fail
		})
	})
	// A failed transaction is a 500 (nothing committed: the sender must
	// redeliver), and the cause stays in the log.
	fail <- errors.New("commit: connection reset")
	m := wantError(t, f.do(t, http.MethodPost, "/v1/webhooks/x", "", `{}`), http.StatusInternalServerError, codeInternal)
	if strings.Contains(m["detail"].(string), "reset") {
		t.Fatalf("500 leaks the cause: %v", m)
	}
	fail <- context.DeadlineExceeded
	wantError(t, f.do(t, http.MethodPost, "/v1/webhooks/x", "", `{}`), http.StatusServiceUnavailable, codeUnavailable)
}
