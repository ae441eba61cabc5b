package outbox_test

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/outbox"
	"github.com/effectline/effectline/store"
)

// An agent service places an order in three steps: reserve the stock,
// charge the card, confirm to the customer. Each step changes the service's
// own orders table and records the step's intent in the same transaction,
// under a key derived from the order id and the step name, so the intent
// exists exactly when the business change does. The relay (running in
// effectline) publishes the intents; the executor runs the tools.
func Example_agentService() {
	ctx := context.Background()
	pool, cleanup, err := exampleDatabase(ctx) // effectline migrate has run
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}

	type step struct {
		name   string
		status string // the order's status once the step is requested
		tool   string
		class  events.EffectClass
		args   string
	}
	steps := []step{
		{"reserve", "reserving", "inventory.reserve", events.Compensable, `{"sku":"BOOK-7","qty":1}`},
		{"charge", "charging", "payments.charge", events.Irreversible, `{"amount":4200,"currency":"EUR"}`},
		{"confirm", "confirming", "notify.confirm", events.Idempotent, `{"template":"order-confirmed"}`},
	}
	// run is one step of the workflow: a business write and an intent, one
	// transaction.
	run := func(orderID string, s step) error {
		key, err := outbox.OperationKey(orderID, s.name)
		if err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (id, status) VALUES ($1, $2)
				ON CONFLICT (id) DO UPDATE SET status = excluded.status`, orderID, s.status); err != nil {
				return err
			}
			res, err := outbox.Append(ctx, tx, outbox.Intent{
				OperationKey: key,
				Tool:         s.tool,
				EffectClass:  s.class,
				Args:         json.RawMessage(s.args),
				Principal:    "order-agent",
			})
			if err != nil {
				return err
			}
			fmt.Printf("%s: created=%t status=%s\n", key, res.Created, res.Operation.Status)
			return nil
		})
	}

	for _, s := range steps[:2] {
		if err := run("order-1001", s); err != nil {
			fmt.Println(err)
			return
		}
	}

	// The service crashed after committing the charge step and runs it
	// again: same key, same args, nothing new is recorded.
	if err := run("order-1001", steps[1]); err != nil {
		fmt.Println(err)
		return
	}

	// A bug changes the amount on the retry: refused, and the business
	// write of that transaction rolls back with it.
	wrong := steps[1]
	wrong.args, wrong.status = `{"amount":4300,"currency":"EUR"}`, "charged-twice"
	if err := run("order-1001", wrong); outbox.IsPayloadConflict(err) {
		fmt.Println("changed charge refused:", errors.Is(err, outbox.ErrPayloadConflict))
	}

	if err := run("order-1001", steps[2]); err != nil {
		fmt.Println(err)
		return
	}

	var status string
	var waiting int
	if err := pool.QueryRow(ctx, `SELECT (SELECT status FROM orders WHERE id = 'order-1001'),
		(SELECT count(*) FROM outbox)`).Scan(&status, &waiting); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("order status=%s, outbox rows waiting for the relay=%d\n", status, waiting)

	// Output:
	// wf:order-1001/reserve: created=true status=pending
	// wf:order-1001/charge: created=true status=pending
	// wf:order-1001/charge: created=false status=pending
	// changed charge refused: true
	// wf:order-1001/confirm: created=true status=pending
	// order status=confirming, outbox rows waiting for the relay=6
}

// exampleDatabase creates a migrated, throwaway database on the server the
// tests use (EFFECTLINE_TEST_DATABASE_URL, else the local default) and
// returns a pool on it and a cleanup that drops it. Examples cannot use
// testenv.NewDatabase, which needs a *testing.T.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, func(), error) {
	adminURL := os.Getenv("EFFECTLINE_TEST_DATABASE_URL")
	if adminURL == "" {
		adminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, nil, fmt.Errorf("example: PostgreSQL is not reachable: %w", err)
	}
	defer admin.Close(context.Background())

	var b [8]byte
	_, _ = cryptorand.Read(b[:])
	name := "effectline_test_example_" + hex.EncodeToString(b[:])
	// The same advisory lock testenv takes around CREATE DATABASE: copies of
	// template1 made at once by parallel test binaries fail with 55006.
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(0x6566666c696e65)); err != nil {
		return nil, nil, err
	}
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if err == nil || attempt == 10 || !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, _ = admin.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(0x6566666c696e65))
	if err != nil {
		return nil, nil, fmt.Errorf("example: creating a database: %w", err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(dctx, adminURL); err == nil {
			_, _ = c.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			_ = c.Close(dctx)
		}
	}

	u, err := url.Parse(adminURL)
	if err != nil {
		drop()
		return nil, nil, err
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		drop()
		return nil, nil, err
	}
	if _, err := store.Migrate(ctx, pool); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}
