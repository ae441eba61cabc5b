package loadgen

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/internal/procstat"
	"github.com/effectline/effectline/internal/testenv"
)

func TestCPULineKeepsTheMachineFirst(t *testing.T) {
	c := cpuPerOp{process: 1.2, machine: 2.0, postgres: 0.7, postgresSeen: true}
	got := c.line("operation", false, 0)
	if want := "cpu: 2.00 ms per operation on the whole machine, 1.20 ms of it in this process, 0.70 ms in PostgreSQL's processes, 0.10 ms elsewhere"; got != want {
		t.Errorf("line =\n%s\nwant\n%s", got, want)
	}
	c.postgres = 0.9
	if got, want := c.line("operation", false, 0), "cpu: 2.00 ms per operation on the whole machine, 1.20 ms of it in this process, 0.90 ms in PostgreSQL's processes (the machine's tick-sampled total is 0.10 ms below these: it misses short bursts)"; got != want {
		t.Errorf("line =\n%s\nwant\n%s", got, want)
	}
	c.postgresSeen = false
	if got := c.line("step", false, 0); !strings.HasSuffix(got, "(the rest is PostgreSQL and whatever else runs)") || !strings.HasPrefix(got, "cpu: 2.00 ms per step") {
		t.Errorf("without PostgreSQL on the machine: %s", got)
	}
	c = cpuPerOp{process: 0.3, machine: 2.0, postgres: 0.9, postgresSeen: true}
	if got, want := c.line("operation", true, 0.6), "cpu: 2.00 ms per operation on the whole machine, 0.60 ms of it in the components' processes, 0.30 ms in this one (the agent, the tool), 0.90 ms in PostgreSQL's processes, 0.20 ms elsewhere"; got != want {
		t.Errorf("split line =\n%s\nwant\n%s", got, want)
	}
}

// TestPostgresBusyCountsABackendThatEnded burns CPU in a backend, closes
// it, and checks the PostgreSQL total still holds what the backend used:
// once the backend is gone its time is only in the postmaster's cutime.
func TestPostgresBusyCountsABackendThatEnded(t *testing.T) {
	before, found := postgresBusy()
	if !found {
		t.Skip("no PostgreSQL process on this machine (the test database is elsewhere)")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	if _, err := os.Stat(stat); err != nil {
		t.Skipf("the test database's backend %d is not on this machine", pid)
	}
	if _, err := conn.Exec(ctx, `SELECT sum(i) FROM generate_series(1, 3000000) i`); err != nil {
		t.Fatal(err)
	}
	backend, err := procstat.Read(strconv.Itoa(pid))
	if err != nil || backend.CPU() == 0 {
		t.Fatalf("the backend's own stat: %+v, %v", backend, err)
	}
	used := backend.CPU()
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The postmaster reaps the backend when it exits; until then it is
	// still listed, with its own time.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(stat); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d still there 10 s after its connection closed", pid)
		}
	}
	after, _ := postgresBusy()
	if after-before < used {
		t.Errorf("PostgreSQL's CPU grew by %s while a backend that has ended used %s", after-before, used)
	}
}
