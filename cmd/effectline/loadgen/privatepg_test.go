package loadgen

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/testenv"
)

// EnvPrivatePostgres, set to a duration, makes TestPrivatePostgres start a
// PostgreSQL server of its own configured like a production one
// (autovacuum on) and keep it that long, for a soak to run against:
//
//	EFFECTLINE_BENCH_PRIVATE_POSTGRES=40m go test -run TestPrivatePostgres -timeout 0 -v ./cmd/effectline/loadgen &
//	EFFECTLINE_DATABASE_URL=<the URL it prints> effectline bench -duration 20m -rate 500 -retention 1m
//
// The shared server of this machine runs with autovacuum off, which no
// production server does, and a soak of retention is about what vacuum
// gives back.
const EnvPrivatePostgres = "EFFECTLINE_BENCH_PRIVATE_POSTGRES"

// privatePostgresSettings are the server's settings on top of initdb's
// defaults (docs/benchmarks.md quotes them).
var privatePostgresSettings = []string{"autovacuum=on", "shared_buffers=256MB", "max_connections=100"}

func TestPrivatePostgres(t *testing.T) {
	v := os.Getenv(EnvPrivatePostgres)
	if v == "" {
		t.Skip("set " + EnvPrivatePostgres + " to a duration to start a private PostgreSQL server for a soak")
	}
	keep, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: want a duration", EnvPrivatePostgres, v)
	}
	s := testenv.NewPostgresServer(t, privatePostgresSettings...)
	fmt.Printf("private PostgreSQL (%v) for %s: EFFECTLINE_DATABASE_URL=%s\n", privatePostgresSettings, keep, s.URL)
	time.Sleep(keep)
}
