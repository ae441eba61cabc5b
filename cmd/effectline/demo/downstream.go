// Package demo is the worked example of `effectline dev --demo`: three
// downstream services with realistic faults (a reservation whose first
// response is lost, a charge whose response is lost after it committed, an
// email service that answers 429 with Retry-After) and an agent service
// that places one order through them, printing a live timeline.
package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Downstream is an in-process stand-in for the order's three external
// services. Each honors Idempotency-Key the way Stripe does: a repeated key
// gets the stored response and no new effect.
type Downstream struct {
	URL string

	mu       sync.Mutex
	srv      *http.Server
	effects  map[string]map[string]*effect // service -> idempotency key -> effect
	requests map[string]int                // service -> requests to its invoke endpoint
	faults   map[string][]string           // service -> remaining faults for invoke
	// cannotTell holds idempotency keys whose first invoke loses its
	// response and whose lookup never answers: the ledger is down for them.
	cannotTell map[string]bool
	// unanswered holds, per such key, when each lookup went unanswered:
	// the reconciler's asks, which it does not journal, for the timeline.
	unanswered map[string][]time.Time
	nextID     int
}

type effect struct {
	ID       string          `json:"id"`
	Key      string          `json:"idempotency_key"`
	Service  string          `json:"service"`
	Args     json.RawMessage `json:"args"`
	Released bool            `json:"released"`
	At       time.Time       `json:"created_at"`
}

// Services of the demo, in order.
var Services = []string{"inventory", "payments", "email"}

// Faults injected on the first call of each service (contract §1's three classes).
const (
	faultLoseResponse = "lose-response"    // apply, then drop the connection
	faultTooMany      = "429-retry-after1" // answer 429 with Retry-After: 1, no effect
)

// StartDownstream listens on 127.0.0.1 on a free port.
func StartDownstream() (*Downstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &Downstream{
		URL:        "http://" + ln.Addr().String(),
		effects:    map[string]map[string]*effect{},
		requests:   map[string]int{},
		cannotTell: map[string]bool{},
		unanswered: map[string][]time.Time{},
		faults: map[string][]string{
			"inventory": {faultLoseResponse},
			"payments":  {faultLoseResponse},
			"email":     {faultTooMany},
		},
	}
	for _, s := range Services {
		d.effects[s] = map[string]*effect{}
	}
	d.srv = &http.Server{Handler: http.HandlerFunc(d.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.srv.Serve(ln) }()
	return d, nil
}

// CannotTell makes the effect under the Idempotency-Key key one nobody can
// confirm: the first invoke applies it and loses the response, and every
// lookup answers 503, so reconciliation cannot tell whether it happened
// and a human has to decide.
func (d *Downstream) CannotTell(key string) {
	d.mu.Lock()
	d.cannotTell[key] = true
	d.mu.Unlock()
}

// Unanswered returns when each lookup of key went unanswered (keys made
// CannotTell), oldest first.
func (d *Downstream) Unanswered(key string) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.unanswered[key]...)
}

// Close stops the server.
func (d *Downstream) Close() error { return d.srv.Close() }

// ToolsYAML is the tools file for the demo's services, with the order
// workflow that runs through them.
func (d *Downstream) ToolsYAML() string {
	return strings.ReplaceAll(`tools:
  - name: inventory.reserve
    effect: compensable
    invoke:     {method: POST, url: "URL/inventory/reservations", timeout: 2s}
    compensate: {method: POST, url: "URL/inventory/reservations/release", timeout: 2s}
    reconcile:  {method: GET,  url: "URL/inventory/reservations?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 200ms, max_delay: 5s, deadline: 30s}
    args_schema:
      type: object
      required: [sku, quantity]
      properties:
        sku: {type: string}
        quantity: {type: integer, minimum: 1}
  - name: payments.charge
    effect: irreversible
    invoke:    {method: POST, url: "URL/payments/charges", timeout: 2s}
    reconcile: {method: GET,  url: "URL/payments/charges?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 200ms, max_delay: 5s, deadline: 30s}
    args_schema:
      type: object
      required: [amount, currency, card_number]
      properties:
        amount: {type: integer, minimum: 1}
        currency: {type: string, enum: [EUR, USD]}
        card_number: {type: string, writeOnly: true}
  - name: email.send
    effect: irreversible
    invoke:    {method: POST, url: "URL/email/messages", timeout: 2s}
    reconcile: {method: GET,  url: "URL/email/messages?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 200ms, max_delay: 5s, deadline: 30s}
    args_schema:
      type: object
      required: [to, template]
      properties:
        to: {type: string}
        template: {type: string}
workflows:
  - name: order
    input_schema:
      type: object
      required: [order_id, sku, quantity, amount]
      properties:
        order_id: {type: string}
        sku: {type: string}
        quantity: {type: integer, minimum: 1}
        amount: {type: integer, minimum: 1}
    steps:
      - name: reserve
        tool: inventory.reserve
        args: {sku: "{{.Input.sku}}", quantity: "{{.Input.quantity}}"}
      - name: charge
        tool: payments.charge
        args: {amount: "{{.Input.amount}}", currency: EUR, card_number: "4242424242424242"}
      - name: confirm
        tool: email.send
        args: {to: customer@example.com, template: order_confirmed}
`, "URL", d.URL)
}

func (d *Downstream) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(parts) < 2 {
		http.NotFound(w, r)
		return
	}
	service := parts[0]
	if _, ok := d.effects[service]; !ok {
		http.NotFound(w, r)
		return
	}
	switch {
	case r.Method == http.MethodGet:
		d.lookup(w, service, r.URL.Query().Get("idempotency_key"))
	case r.Method == http.MethodPost && len(parts) == 3 && parts[2] == "release":
		d.release(w, r, service)
	case r.Method == http.MethodPost:
		d.invoke(w, r, service)
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (d *Downstream) invoke(w http.ResponseWriter, r *http.Request, service string) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	key := r.Header.Get("Idempotency-Key")
	d.mu.Lock()
	d.requests[service]++
	fault := ""
	if _, seen := d.effects[service][key]; d.cannotTell[key] && !seen {
		fault = faultLoseResponse
	} else if fs := d.faults[service]; len(fs) > 0 {
		fault, d.faults[service] = fs[0], fs[1:]
	}
	if fault == faultTooMany {
		d.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": "rate_limited"})
		return
	}
	e, seen := d.effects[service][key]
	if !seen {
		d.nextID++
		e = &effect{ID: fmt.Sprintf("%s_%d", service[:3], d.nextID), Key: key, Service: service, Args: json.RawMessage(body), At: time.Now().UTC()}
		d.effects[service][key] = e
	}
	out, _ := json.Marshal(e)
	d.mu.Unlock()
	if fault == faultLoseResponse {
		// The effect is committed; the response never arrives.
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

func (d *Downstream) lookup(w http.ResponseWriter, service, key string) {
	d.mu.Lock()
	if d.cannotTell[key] {
		d.unanswered[key] = append(d.unanswered[key], time.Now())
		d.mu.Unlock()
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "ledger_unavailable"})
		return
	}
	e, ok := d.effects[service][key]
	var out []byte
	if ok && !e.Released {
		out, _ = json.Marshal(e)
	}
	d.mu.Unlock()
	if out == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "not_found"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

func (d *Downstream) release(w http.ResponseWriter, r *http.Request, service string) {
	var req struct {
		Key string `json:"idempotency_key"`
	}
	_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req)
	d.mu.Lock()
	if e, ok := d.effects[service][req.Key]; ok {
		e.Released = true
	}
	d.mu.Unlock()
	// Releasing what never happened succeeds too (contract §1).
	writeJSON(w, http.StatusOK, map[string]string{"status": "released"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Tally is what one service saw.
type Tally struct {
	Service  string
	Requests int
	Effects  int // standing (not released)
	Released int
	// Duplicates counts operations with more than one standing effect: the
	// figure effectline exists to keep at zero.
	Duplicates int
}

// Tallies counts requests and effects per service.
func (d *Downstream) Tallies() []Tally {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Tally
	for _, s := range Services {
		t := Tally{Service: s, Requests: d.requests[s]}
		perOp := map[string]int{}
		for key, e := range d.effects[s] {
			if e.Released {
				t.Released++
				continue
			}
			t.Effects++
			op, _, _ := strings.Cut(key, "~c")
			perOp[op]++
		}
		for _, n := range perOp {
			if n > 1 {
				t.Duplicates += n - 1
			}
		}
		out = append(out, t)
	}
	return out
}
