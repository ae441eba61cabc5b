package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/effectline/effectline/projector"
	"github.com/effectline/effectline/store"
)

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := configFromEnv(getenv)
	if err != nil {
		return err
	}
	pool, err := connectDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := store.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(stdout, "schema is up to date")
		return nil
	}
	fmt.Fprintf(stdout, "applied migrations %v\n", applied)
	return nil
}

func runProjectorCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "rebuild" {
		fmt.Fprintln(stderr, "usage: effectline projector rebuild")
		return errUsage
	}
	fs := newFlags("projector rebuild", stderr)
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	cfg, err := configFromEnv(getenv)
	if err != nil {
		return err
	}
	pool, err := connectDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	start := time.Now()
	n, err := projector.Rebuild(ctx, store.New(pool))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rebuilt operation_state: %d operations in %s\n", n, time.Since(start).Round(time.Millisecond))
	return nil
}

// runHealthcheck is the container healthcheck: distroless images have no
// shell or curl, so the binary checks itself.
func runHealthcheck(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	url := ""
	if len(args) > 0 {
		url = args[0]
	}
	if url == "" {
		addr := getenv(envHTTPAddr)
		if addr == "" {
			addr = defaultHTTPAddr
		}
		url = "http://" + addr + "/healthz"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}
