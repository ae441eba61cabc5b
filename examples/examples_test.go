package examples

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/internal/testenv"
)

// TestGoToolExample builds and runs examples/gotool, a module of its own
// (its go.mod replaces effectline with this tree), on a fresh database: it
// registers a Go tool, builds every component from the public packages and
// runs one operation to completed with exactly one effect.
func TestGoToolExample(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", ".")
	cmd.Dir = "gotool"
	// -mod=mod: the example's go.sum may lag behind this module's
	// requirements without the proof being any weaker.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "EFFECTLINE_DATABASE_URL="+db)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run examples/gotool: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "completed: downstream id greeting-") || !strings.Contains(string(out), "effects 1\n") {
		t.Fatalf("the example did not report one completed operation with one effect:\n%s", out)
	}
}
