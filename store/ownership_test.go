package store_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// tableOwners names, for every table, the one package whose code may run
// statements on it. Everyone else goes through that package's methods, so a
// table's layout can change in one place.
var tableOwners = map[string]string{
	"operations":         "store",
	"events":             "store",
	"outbox":             "store",
	"outbox_slot":        "store",
	"operation_state":    "projector",
	"webhook_deliveries": "reconciler",
	"workflows":          "workflow",
	"workflow_events":    "workflow",
	"workflow_state":     "projector",
}

// joinedReads are the statements that name another package's table on
// purpose, each inside one statement whose atomicity a method call would
// lose, with the reason. A new entry needs a reason as good as these.
var joinedReads = map[string]map[string]string{
	// The projector's upsert skips operations pruned to tombstones in the
	// same statement; checked apart, a prune between the check and the
	// upsert would bring a pruned row back.
	"projector/state.go": {"operations": "per-row guard against pruned operations"},
	// Pruning turns head rows into tombstones and drops their read-model
	// rows in one statement, so no list ever shows an operation whose
	// events are gone.
	// It also locks, in the transaction that prunes a page, the runs of
	// the page's step operations FOR SHARE and keeps the steps they
	// await: checked apart, a run could start waiting between the check
	// and the prune and be stranded on a tombstone.
	"store/prune.go": {"operation_state": "deleted with the tombstoning", "workflows": "FOR SHARE lock of the runs a page's steps belong to"},
	// The same two guards for runs: the projector's upsert skips runs
	// pruned to tombstones (and locks their head rows FOR KEY SHARE, so a
	// prune cannot commit between its check and its write), and pruning a
	// run drops its read-model row in the statement that tombstones it.
	"projector/workflow_state.go": {"workflows": "FOR KEY SHARE guard against pruned runs"},
	"workflow/prune.go":           {"workflow_state": "deleted with the tombstoning"},
	// `bench -history` is a fixture, like a test's: it copies rows the
	// components wrote (head rows, events, read-model rows) under new
	// keys, byte for byte but for the keys and ids, so a run can start
	// from millions of operations of history. Methods of the owners for
	// it would put fixture code in the product.
	"cmd/effectline/loadgen/history.go": {"operations": "fixture: copies of the warm-up's head rows",
		"events": "fixture: copies of the warm-up's events", "operation_state": "fixture: copies of the warm-up's read-model rows"},
	// The workflow driver finds the workflows whose awaited step settled
	// with one join over every waiting workflow, not one load per workflow.
	"workflow/driver.go": {"operations": "join of waiting workflows to their steps' head rows"},
}

// sqlTable finds a table where SQL names one. The code writes SQL keywords
// in capitals, which keeps prose ("events from Kafka") out; a fragment of a
// statement built by concatenation (" FROM operations") is caught too.
var sqlTable = regexp.MustCompile(`\b(?:FROM|INTO|UPDATE|JOIN|TABLE|ON)\s+([a-z_]+)\b`)

// TestTablesAreTouchedOnlyByTheirOwner reads the string literals of every
// non-test Go file of the module and fails on SQL that names a table outside
// the table's owner package. Tests are exempt: they may look at any table
// to check what the code did.
func TestTablesAreTouchedOnlyByTheirOwner(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		pkgDir := filepath.ToSlash(filepath.Dir(rel))
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, m := range sqlTable.FindAllStringSubmatch(s, -1) {
				owner, ok := tableOwners[strings.ToLower(m[1])]
				if ok && pkgDir != owner && joinedReads[filepath.ToSlash(rel)][strings.ToLower(m[1])] == "" {
					t.Errorf("%s: SQL on table %s, which package %s owns: call a method of %s instead", rel, m[1], owner, owner)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files under %s: the walk did not find the module", checked, root)
	}
}
