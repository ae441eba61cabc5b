package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

// PostgresServer is a PostgreSQL server of one test's own, for the faults
// the shared server must not suffer because other packages use it at the
// same moment: a crash (an immediate shutdown, which loses what was only in
// shared memory, as a power cut loses the page cache) and a restart.
type PostgresServer struct {
	// URL is the server's postgres database, on 127.0.0.1.
	URL string

	bin, data string
	runAs     *user.User // nil: this process's user
}

// NewPostgresServer initialises a cluster in a temporary directory and
// starts it on a free port of 127.0.0.1, with trust authentication, no Unix
// socket, autovacuum off and the given settings ("name=value") on top. It
// is stopped when the test ends. As root it runs as the postgres user,
// since PostgreSQL refuses to run as root. Without PostgreSQL's programs
// the test fails, saying which directory was looked for.
func NewPostgresServer(t testing.TB, settings ...string) *PostgresServer {
	t.Helper()
	s := &PostgresServer{bin: postgresBinDir(t)}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: running PostgreSQL as root needs a postgres user: %v", err)
		}
		s.runAs = u
	}
	root, err := os.MkdirTemp("", "effectline-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	s.data = filepath.Join(root, "data")
	if err := os.Mkdir(s.data, 0o700); err != nil {
		t.Fatal(err)
	}
	if s.runAs != nil {
		uid, _ := strconv.Atoi(s.runAs.Uid)
		gid, _ := strconv.Atoi(s.runAs.Gid)
		if err := os.Chmod(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(s.data, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	s.run(t, "initdb", "-D", s.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

	port := FreePort(t)
	conf := append([]string{
		"listen_addresses='127.0.0.1'", "port=" + strconv.Itoa(port), "unix_socket_directories=''",
		"autovacuum=off", "max_connections=50", "shared_buffers=16MB",
	}, settings...)
	f, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintln(f, strings.Join(conf, "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	s.Start(t)
	t.Cleanup(func() { s.pgCtl(t, "stop", "-m", "fast") })
	return s
}

// Crash stops the server at once: every backend is killed and nothing is
// written on the way out, so the next start runs crash recovery and what
// was committed but not yet written to the WAL on disk is gone.
func (s *PostgresServer) Crash(t testing.TB) {
	t.Helper()
	s.pgCtl(t, "stop", "-m", "immediate")
}

// Start starts the server and waits until it accepts connections.
func (s *PostgresServer) Start(t testing.TB) {
	t.Helper()
	s.pgCtl(t, "start", "-w", "-t", "60", "-l", filepath.Join(s.data, "server.log"))
	ctx, cancel := context.WithTimeout(context.Background(), dbConnectTimeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := connectRetrying(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: the private PostgreSQL server does not answer: %v", err)
	}
	_ = conn.Close(ctx)
}

// NewDatabase creates a database on the server and returns its URL.
func (s *PostgresServer) NewDatabase(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dbCreateTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func (s *PostgresServer) pgCtl(t testing.TB, args ...string) {
	t.Helper()
	s.run(t, "pg_ctl", append([]string{"-D", s.data}, args...)...)
}

func (s *PostgresServer) run(t testing.TB, program string, args ...string) {
	t.Helper()
	name := filepath.Join(s.bin, program)
	if s.runAs != nil {
		args = append([]string{"-u", s.runAs.Username, "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = os.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: %s %s: %v\n%s", program, strings.Join(args, " "), err, out)
	}
}

// postgresBinDir finds PostgreSQL's programs: $PG_BINDIR, the newest
// /usr/lib/postgresql/*/bin (Debian), or the directory of pg_ctl on PATH.
func postgresBinDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return va - vb
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p)
	}
	t.Fatalf("testenv: PostgreSQL's programs (initdb, pg_ctl) are not in $PG_BINDIR, /usr/lib/postgresql/*/bin or on PATH")
	return ""
}

// FreePort returns a port of 127.0.0.1 nothing listens on at the moment.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// RefusedAddr returns an address of 127.0.0.1 that refuses connections
// for the rest of the test and that nothing else can take meanwhile: a
// socket bound to it that never listens. A port FreePort returned is free
// only at that moment; a parallel test's server may bind it next (an
// embedded Kafka broker did, and a test that meant "unreachable" found a
// broker).
func RefusedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
