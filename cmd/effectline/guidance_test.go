package main

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/cmd/effectline/ops"
	"github.com/effectline/effectline/internal/testenv"
)

// The tests of this file run the binary the way a newcomer does and check
// that what goes wrong is answered with what to do about it, and with the
// exit status a script relies on.

// exitCode is the exit status of a finished process, -1 when it was killed.
func exitCode(p *proc) int {
	if p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// finish waits for p to exit by itself and checks its exit status and that
// its output says every one of wants and none of nevers.
func finish(t *testing.T, p *proc, timeout time.Duration, code int, wants, nevers []string) string {
	t.Helper()
	_ = p.wait(timeout)
	out := p.output()
	if got := exitCode(p); got != code {
		t.Errorf("exit status %d, want %d:\n%s", got, code, out)
	}
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("the output does not say %q:\n%s", w, out)
		}
	}
	for _, n := range nevers {
		if strings.Contains(out, n) {
			t.Errorf("the output says %q:\n%s", n, out)
		}
	}
	return out
}

func TestGuidanceMissingDatabase(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("effectline_missing_%d", time.Now().UnixNano())
	u.Path = "/" + name
	host, port, _ := net.SplitHostPort(u.Host)
	user := u.User.Username()
	p := start(t, "migrate (missing database)", map[string]string{envDatabaseURL: u.String()}, "migrate")
	finish(t, p, 60*time.Second, 1,
		[]string{fmt.Sprintf("createdb -h %s -p %s -U %s %s", host, port, user, name), envDatabaseURL},
		[]string{"PostgreSQL must be running", "pg_ctlcluster"})
}

// TestGuidanceBenchFlagsThatDoNotGoTogether: flags each valid alone but
// not together are refused with the rule, not with a silent exit status.
func TestGuidanceBenchFlagsThatDoNotGoTogether(t *testing.T) {
	t.Parallel()
	p := start(t, "bench -in -history", map[string]string{envDatabaseURL: testenv.DatabaseURL()},
		"bench", "-in", "effectline_bench_none", "-history", "1000")
	finish(t, p, 30*time.Second, 1, []string{"effectline bench:", "-in without -history and -workflows"}, nil)
}

func TestGuidancePortInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	env := map[string]string{envDatabaseURL: testenv.NewDatabase(t), envHTTPAddr: ln.Addr().String()}
	p := start(t, "dev (port in use)", env, "dev")
	finish(t, p, 90*time.Second, 1,
		[]string{ln.Addr().String() + " is already in use", "Set " + envHTTPAddr + " to a free address"}, nil)
}

func TestGuidanceKafkaUnreachable(t *testing.T) {
	t.Parallel()
	brokers := testenv.RefusedAddr(t)
	env := map[string]string{envDatabaseURL: testenv.NewDatabase(t), envHTTPAddr: "127.0.0.1:0", envKafkaBrokers: brokers}
	p := start(t, "dev (Kafka unreachable)", env, "dev")
	// Progress long before the 30 s the connection is given.
	p.waitLine(regexp.MustCompile(`still waiting for Kafka at `+regexp.QuoteMeta(brokers)+` \(\d+ s\)`), 60*time.Second)
	finish(t, p, 120*time.Second, 1,
		[]string{"unreachable after 30s", "Check " + envKafkaBrokers + ` (now "` + brokers + `")`}, nil)
}

func TestGuidanceUnknownTemplateField(t *testing.T) {
	t.Parallel()
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, []byte(`tools:
  - name: cache.set
    effect: idempotent
    invoke: {method: POST, url: "http://127.0.0.1:9/effects/{{.Argz.x}}"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{envDatabaseURL: testenv.NewDatabase(t), envHTTPAddr: "127.0.0.1:0",
		envKafkaBrokers: "127.0.0.1:9", envTools: tools}
	p := start(t, "run (unknown template field)", env, "run", "--components", "executor")
	finish(t, p, 60*time.Second, 1,
		[]string{`tool "cache.set": invoke.url: {{.Argz.x}} is not a template field`,
			"the fields are .Key, .OperationKey, .DownstreamID, .Args.NAME", "docs/tools-file.md"},
		[]string{"templateData", "can't evaluate"})
}

func TestGuidanceHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dev", "--help"}, {"run", "--help"}, {"migrate", "-h"}, {"prune", "--help"},
		{"bench", "--help"}, {"projector", "rebuild", "--help"}, {"projector", "--help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			p := start(t, "effectline "+strings.Join(args, " "), nil, args...)
			name := strings.Join(args[:len(args)-1], " ")
			if name == "projector" {
				name = "projector rebuild"
			}
			wants := []string{"Usage: effectline " + name, "Environment:", envDatabaseURL}
			switch args[0] {
			case "dev":
				wants = append(wants, "Flags:", "-demo", "-tools", envKafkaBrokers, "embedded broker", envHTTPAddr, envTools)
			case "run":
				wants = append(wants, "-components", envKafkaBrokers, envAPITokens, app.EnvKafkaReplication)
			}
			finish(t, p, 30*time.Second, 0, wants, []string{"usage", "flag: help requested"})
		})
	}
}

func TestGuidanceInterrupt(t *testing.T) {
	t.Parallel()
	env := map[string]string{envDatabaseURL: testenv.NewDatabase(t), envHTTPAddr: "127.0.0.1:0"}
	p := start(t, "dev (Ctrl-C)", env, "dev")
	p.waitLine(regexp.MustCompile(`^  tools `), 90*time.Second)
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	finish(t, p, 60*time.Second, 0, []string{"effectline dev stopped cleanly"}, []string{"effectline: "})
}

func TestGuidanceResumedDemo(t *testing.T) {
	t.Parallel()
	env := map[string]string{envDatabaseURL: testenv.NewDatabase(t), envHTTPAddr: "127.0.0.1:0"}
	first := start(t, "dev --demo (first)", env, "dev", "--demo", "--exit-after-demo")
	finish(t, first, 3*time.Minute, 0, []string{"3 of 3 steps completed"}, []string{"already ran", "Resuming order"})
	again := start(t, "dev --demo (again)", env, "dev", "--demo", "--exit-after-demo")
	out := finish(t, again, 3*time.Minute, 0,
		[]string{"Order ord-1001 already ran on this database", "nothing is called again", "--order-id ord-1002"}, nil)
	// The note comes before the recorded timeline, not after it.
	if i, j := strings.Index(out, "already ran"), strings.Index(out, "Worked example"); i < 0 || j < 0 || i > j {
		t.Errorf("the note does not precede the timeline:\n%s", out)
	}
}

// TestHelpDescribesEveryVariable: every variable a command's --help lists
// has a description, and every variable the binary reads (but the ops
// client's, which `effectline ops` documents) is listed by some command.
func TestHelpDescribesEveryVariable(t *testing.T) {
	listed := map[string]bool{}
	for name, h := range commandHelp {
		if h.summary == "" {
			t.Errorf("effectline %s --help has no summary", name)
		}
		for _, v := range h.env {
			listed[v] = true
			if envHelp[v] == "" {
				t.Errorf("effectline %s --help lists %s without a description", name, v)
			}
		}
	}
	for _, v := range app.EnvVars {
		if !listed[v] && v != ops.EnvAPIURL && v != ops.EnvAPIToken {
			t.Errorf("%s is read by the binary, but no command's --help lists it", v)
		}
	}
}

func TestNextOrderID(t *testing.T) {
	for in, want := range map[string]string{"ord-1001": "ord-1002", "ord-0099": "ord-0100", "x": "x-2", "7": "8"} {
		if got := nextOrderID(in); got != want {
			t.Errorf("nextOrderID(%q) = %q, want %q", in, got, want)
		}
	}
}
