package httptool

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"strconv"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// signer adds Standard Webhooks headers (contract §5) to outbound calls, so a
// tool can check that the caller is effectline and that the body was not
// altered, with any off-the-shelf Standard Webhooks verifier.
type signer struct {
	wh     *standardwebhooks.Webhook
	secret string
	now    func() time.Time
}

// newSigner takes a secret in the Standard Webhooks form, "whsec_" followed
// by base64 (the prefix is optional).
func newSigner(secret string) (*signer, error) {
	if secret == "" {
		return nil, fmt.Errorf("empty signing secret")
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		// The library's message would echo nothing secret, but keep ours
		// plain anyway.
		return nil, fmt.Errorf("signing secret must be whsec_ followed by base64")
	}
	return &signer{wh: wh, secret: secret, now: time.Now}, nil
}

// sign sets webhook-id, webhook-timestamp and webhook-signature for body.
// Every request gets a fresh id, retries included: the id names the message,
// and a receiver that deduplicates by webhook id must still see a retry,
// which it deduplicates by the idempotency key instead.
func (s *signer) sign(h http.Header, body []byte) error {
	id := "msg_" + rand.Text()
	ts := s.now()
	sig, err := s.wh.Sign(id, ts, body)
	if err != nil {
		return fmt.Errorf("signing request: %w", err)
	}
	h.Set(standardwebhooks.HeaderWebhookID, id)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, sig)
	return nil
}
