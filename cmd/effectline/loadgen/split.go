package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/internal/procstat"
)

// splitComponents are the processes of -split, one component each, as the
// Kubernetes manifests deploy them.
var splitComponents = []string{app.Relay, app.Executor, app.Projector, app.Reconciler, app.API}

// splitProcesses are the children of a -split run.
type splitProcesses struct {
	children []*child
	apiAddrs []string
	dir      string // the tools file's
}

// child is one `effectline run --components <c>` process.
type child struct {
	name string // component and replica, for errors
	cmd  *exec.Cmd
	out  *syncBuffer // its stdout and stderr
	exit chan error  // receives its Wait, once; left there for stop
}

// exited says whether the child has ended.
func (c *child) exited() bool { return len(c.exit) > 0 }

// startSplit starts replicas processes of `effectline run --components <c>`
// for every component, from this very binary, on the bench's database,
// broker and tools file, and waits until each says it is running. Replicas
// of a component share its consumer group, so they split the partitions.
func startSplit(ctx context.Context, cfg app.Config, toolsYAML string, replicas int) (*splitProcesses, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench -split: finding this binary: %w", err)
	}
	dir, err := os.MkdirTemp("", "effectline-split-")
	if err != nil {
		return nil, err
	}
	sp := &splitProcesses{dir: dir}
	tools := filepath.Join(dir, "tools.yaml")
	if err := os.WriteFile(tools, []byte(toolsYAML), 0o600); err != nil {
		sp.stop()
		return nil, err
	}
	for _, c := range splitComponents {
		for r := range replicas {
			if err := sp.start(ctx, self, c, r, cfg, tools); err != nil {
				sp.stop()
				return nil, err
			}
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, c := range sp.children {
		for !strings.Contains(c.out.String(), `"msg":"effectline running"`) {
			if time.Now().After(deadline) || c.exited() {
				err := fmt.Errorf("bench -split: %s did not start; its output:\n%s", c.name, c.out.String())
				sp.stop()
				return nil, err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return sp, nil
}

// start starts replica r of component c.
func (sp *splitProcesses) start(ctx context.Context, self, c string, r int, cfg app.Config, tools string) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		app.EnvDatabaseURL + "=" + cfg.DatabaseURL,
		app.EnvKafkaBrokers + "=" + strings.Join(cfg.KafkaBrokers, ","),
		app.EnvTools + "=" + tools,
		app.EnvHTTPAddr + "=" + addr,
		app.EnvInsecureOpenAPI + "=true",
		app.EnvLogLevel + "=info", // "effectline running" is an info line
	}
	if cfg.Partitions > 0 {
		env = append(env, app.EnvKafkaPartitions+"="+strconv.Itoa(int(cfg.Partitions)))
	}
	cmd := exec.CommandContext(ctx, self, "run", "--components", c)
	cmd.Env = env
	ch := &child{name: fmt.Sprintf("%s #%d", c, r+1), cmd: cmd, out: &syncBuffer{}, exit: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = ch.out, ch.out
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("bench -split: starting %s: %w", ch.name, err)
	}
	go func() { ch.exit <- cmd.Wait() }()
	sp.children = append(sp.children, ch)
	if c == app.API {
		sp.apiAddrs = append(sp.apiAddrs, addr)
	}
	return nil
}

// stop sends every child SIGTERM and waits for it. A child that failed is
// reported with the end of its output.
func (sp *splitProcesses) stop() error {
	for _, c := range sp.children {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	var errs []error
	for _, c := range sp.children {
		if err := <-c.exit; err != nil {
			out := c.out.String()
			errs = append(errs, fmt.Errorf("bench -split: %s: %w; its output ends:\n%s", c.name, err, out[max(0, len(out)-2000):]))
		}
	}
	_ = os.RemoveAll(sp.dir)
	return errors.Join(errs...)
}

// cpu is the CPU time the children have used so far, from /proc; zero
// without children.
func (sp *splitProcesses) cpu() time.Duration {
	if sp == nil {
		return 0
	}
	var total time.Duration
	for _, c := range sp.children {
		if p, err := procstat.Read(strconv.Itoa(c.cmd.Process.Pid)); err == nil {
			total += p.CPU()
		}
	}
	return total
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// syncBuffer is a bytes.Buffer safe for a child's writes and our reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
