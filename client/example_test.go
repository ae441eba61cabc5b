package client_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/client"
	"github.com/effectline/effectline/internal/testenv"
)

// baseURL is the API of a real `effectline dev` the examples talk to: the
// binary built from ./cmd/effectline, on a fresh database, with its
// embedded broker and a downstream that charges up to 1000 and refuses more.
var baseURL string

func TestMain(m *testing.M) {
	code, err := runWithServer(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client tests:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func runWithServer(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "effectline-client-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "effectline")
	build := exec.Command("go", "build", "-o", bin, "../cmd/effectline")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return 0, fmt.Errorf("building effectline: %w", err)
	}

	downstream := httptest.NewServer(http.HandlerFunc(chargeDownstream))
	defer downstream.Close()
	tools := filepath.Join(dir, "tools.yaml")
	if err := os.WriteFile(tools, []byte(strings.ReplaceAll(toolsFile, "URL", downstream.URL)), 0o600); err != nil {
		return 0, err
	}
	db, drop, err := newDatabase()
	if err != nil {
		return 0, err
	}
	defer drop()

	cmd := exec.Command(bin, "dev", "--tools", tools)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"EFFECTLINE_DATABASE_URL=" + db, "EFFECTLINE_HTTP_ADDR=127.0.0.1:0"}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	apiLine := regexp.MustCompile(`API\s+(http://127\.0\.0\.1:\d+)/v1/`)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if m := apiLine.FindStringSubmatch(sc.Text()); m != nil {
			baseURL = m[1]
			break
		}
	}
	if baseURL == "" {
		return 0, errors.New("effectline dev exited before printing its API address")
	}
	go func() {
		for sc.Scan() { // keep the pipe flowing
		}
	}()
	return m.Run(), nil
}

const toolsFile = `tools:
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "URL/charges", timeout: 3s}
    reconcile: {method: GET, url: "URL/charges?idempotency_key={{.Key}}", timeout: 2s}
    args_schema:
      type: object
      required: [amount]
      properties:
        amount: {type: integer, minimum: 1}
`

// chargeDownstream charges up to 1000 and refuses more with a 422 that
// says why.
func chargeDownstream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":"no such charge"}`))
		return
	}
	var args struct {
		Amount int `json:"amount"`
	}
	_ = json.NewDecoder(r.Body).Decode(&args)
	if args.Amount > 1000 {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte(`{"error":"amount exceeds order total"}`))
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":"ch_%d","amount":%d}`, args.Amount, args.Amount)
}

// newDatabase creates an empty database on the test server and returns
// its URL and how to drop it.
func newDatabase() (string, func(), error) {
	admin := testenv.DatabaseURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("connecting to %s (start PostgreSQL): %w", testenv.DatabaseURLEnv, err)
	}
	defer conn.Close(context.Background())
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "effectline_client_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, err
	}
	u, _ := url.Parse(admin)
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	}
	return u.String(), drop, nil
}

func ExampleClient_Submit() {
	c, _ := client.New(baseURL) // dev runs open; pass client.WithToken(...) otherwise
	ctx := context.Background()
	intent := client.Intent{OperationKey: "order-7/charge", Tool: "payments.charge", Args: map[string]int{"amount": 700}}
	r, err := c.Submit(ctx, intent, 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.State, string(r.Value))

	// The same intent again executes nothing: it answers the stored outcome.
	again, _ := c.Submit(ctx, intent, 0)
	fmt.Println(again.State, string(again.Value))

	// A rejection says why, so the input can be corrected.
	r, _ = c.Submit(ctx, client.Intent{OperationKey: "order-8/charge", Tool: "payments.charge",
		Args: map[string]int{"amount": 5000}}, 30*time.Second)
	fmt.Println(r.State, r.Next, strings.Contains(r.Reason, "amount exceeds order total"))
	// Output:
	// succeeded {"id":"ch_700","amount":700}
	// succeeded {"id":"ch_700","amount":700}
	// failed fix_args true
}

func ExampleClient_Wait() {
	c, _ := client.New(baseURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.Submit(ctx, client.Intent{OperationKey: "order-9/charge", Tool: "payments.charge",
		Args: map[string]int{"amount": 90}}, 0); err != nil {
		fmt.Println(err)
		return
	}
	r, err := c.Wait(ctx, "order-9/charge")
	if err != nil {
		fmt.Println(err)
		return
	}
	switch r.State {
	case client.Succeeded:
		fmt.Println("charged:", string(r.Value))
	case client.Failed:
		fmt.Println("no charge:", r.Reason)
	case client.Unknown:
		fmt.Println("may have been charged; do not retry:", r.Reason)
	}
	// Output:
	// charged: {"id":"ch_90","amount":90}
}

func ExampleClient_Get() {
	c, _ := client.New(baseURL)
	ctx := context.Background()
	_, _ = c.Submit(ctx, client.Intent{OperationKey: "order-10/charge", Tool: "payments.charge",
		Args: map[string]int{"amount": 10}}, 30*time.Second)
	r, err := c.Get(ctx, "order-10/charge")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.OperationKey, r.State, r.Status)

	_, err = c.Get(ctx, "order-11/never-submitted")
	var apiErr *client.Error
	fmt.Println(errors.As(err, &apiErr), apiErr.StatusCode)
	// Output:
	// order-10/charge succeeded completed
	// true 404
}

func ExampleClient_Stream() {
	c, _ := client.New(baseURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = c.Submit(ctx, client.Intent{OperationKey: "order-12/charge", Tool: "payments.charge",
		Args: map[string]int{"amount": 12}}, 0)
	err := c.Stream(ctx, "order-12/charge", 0, func(e client.Event) error {
		fmt.Println(e.Seq, e.Type)
		return nil
	})
	fmt.Println("settled:", err == nil)
	// Output:
	// 1 intent.recorded
	// 2 attempt.started
	// 3 attempt.succeeded
	// settled: true
}
