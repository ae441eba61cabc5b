package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/testenv"
)

// binary is the effectline binary built once for the end-to-end tests, so
// they run the program the way a user does.
var binary string

// crashBinary is the same program built with -tags crashpoints, which
// alone honors EFFECTLINE_CRASHPOINT; built on first use by the crash
// tests, beside binary.
var crashBinary = sync.OnceValues(func() (string, error) {
	path := binary + "-crashpoints"
	build := exec.Command("go", "build", "-tags", "crashpoints", "-o", path, ".")
	out, err := build.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building effectline -tags crashpoints: %v\n%s", err, out)
	}
	return path, nil
})

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "effectline-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binary = filepath.Join(dir, "effectline")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building effectline:", err)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running effectline process.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer
	done   chan struct{}
	err    error
	lines  chan string
	name   string
	killed bool
}

// start runs the binary with env added to a clean environment.
func start(t *testing.T, name string, env map[string]string, args ...string) *proc {
	t.Helper()
	return startBinary(t, binary, name, env, args...)
}

// startBinary is start with another build of the program (crashBinary).
func startBinary(t *testing.T, bin, name string, env map[string]string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &proc{t: t, cmd: cmd, done: make(chan struct{}), lines: make(chan string, 4096), name: name}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.out.WriteString(line + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- line:
			default:
			}
		}
		// A line past the buffer ends the scan; keep the pipe flowing so
		// the process and Wait never block on it.
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		p.err = cmd.Wait()
		_ = pw.Close()
		// The scanner may still hold the last line it read: done means
		// the whole output is in p.out.
		<-scanned
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("output of %s:\n%s", name, p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// kill SIGKILLs the process, as a crash or an OOM kill would.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.killed = true
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits for a graceful exit.
func (p *proc) stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("%s did not stop within %s", p.name, timeout)
	}
}

// wait waits for the process to exit by itself.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("%s still running after %s", p.name, timeout)
	}
}

// waitLine waits for an output line matching re and returns its submatches.
func (p *proc) waitLine(re *regexp.Regexp, timeout time.Duration) []string {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line := <-p.lines:
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-p.done:
			// Drain what is left.
			for {
				select {
				case line := <-p.lines:
					if m := re.FindStringSubmatch(line); m != nil {
						return m
					}
				default:
					p.t.Fatalf("%s exited (%v) before printing %s", p.name, p.err, re)
				}
			}
		case <-deadline:
			p.t.Fatalf("%s did not print %s within %s", p.name, re, timeout)
		}
	}
}

// world is what one end-to-end test runs against: a fresh database, an
// embedded broker and a fake downstream, plus the environment that points
// the binary at them.
type world struct {
	db     string
	broker *testenv.Broker
	fake   *testenv.FakeTool
	env    map[string]string
}

const e2eTools = `tools:
  - name: cache.set
    effect: idempotent
    invoke: {method: POST, url: "URL/effects/cache", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
  - name: inventory.reserve
    effect: compensable
    invoke: {method: POST, url: "URL/effects/reservations", timeout: 3s}
    compensate: {method: POST, url: "URL/effects/release", timeout: 2s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
  - name: payments.charge
    effect: irreversible
    invoke: {method: POST, url: "URL/effects/charges", timeout: 3s}
    reconcile: {method: GET, url: "URL/effects?idempotency_key={{.Key}}", timeout: 2s}
    retry: {max_attempts: 4, base_delay: 20ms, max_delay: 500ms, deadline: 60s}
    args_schema:
      type: object
      properties:
        card_number: {type: string, writeOnly: true}
`

func newWorld(t *testing.T, fakeOpts ...testenv.FakeOption) *world {
	t.Helper()
	w := &world{db: testenv.NewDatabase(t), broker: testenv.NewBroker(t), fake: testenv.NewFakeTool(t, fakeOpts...)}
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, []byte(strings.ReplaceAll(e2eTools, "URL", w.fake.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	w.env = map[string]string{
		envDatabaseURL:                   w.db,
		envKafkaBrokers:                  strings.Join(w.broker.Addrs, ","),
		envTools:                         tools,
		envKafkaPartitions:               "3",
		envHTTPAddr:                      "127.0.0.1:0", // every process its own port: they run side by side
		envExecutorLease:                 "2s",
		envSweepInterval:                 "200ms",
		envShutdownGrace:                 "3s",
		envLogLevel:                      "info",
		"EFFECTLINE_TEST_CONTEXT_MARKER": t.Name(),
	}
	migrate := start(t, "migrate", w.env, "migrate")
	if err := migrate.wait(60 * time.Second); err != nil {
		t.Fatalf("migrate: %v\n%s", err, migrate.output())
	}
	return w
}

// with returns w's environment plus extra.
func (w *world) with(extra map[string]string) map[string]string {
	env := map[string]string{}
	for k, v := range w.env {
		env[k] = v
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// untilCtx is a context for polling loops in tests.
func untilCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
