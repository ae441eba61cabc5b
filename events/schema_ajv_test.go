package events_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestSchemasCompileUnderAjvStrict compiles events/schema with ajv (the
// JSON Schema validator most JavaScript producers and consumers use) in
// strict mode, pinned in scripts/schemacheck/package.json. Strict mode
// refuses schemas that other validators accept silently: a "required" naming
// a property the same subschema does not define, a "minimum" without a
// numeric "type". A producer in another language should be able to load the
// schemas as they ship.
//
// .ci/run installs the pinned ajv (npm ci in scripts/schemacheck); elsewhere
// the test skips until it is installed, except under CI=true, where a
// missing ajv is a failure.
func TestSchemasCompileUnderAjvStrict(t *testing.T) {
	dir := filepath.Join("..", "scripts", "schemacheck")
	node, err := exec.LookPath("node")
	installed := err == nil
	if _, statErr := os.Stat(filepath.Join(dir, "node_modules", "ajv")); statErr != nil {
		installed = false
	}
	if !installed {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node and the pinned ajv are needed: run `npm ci --prefix %s` (.ci/run does)", dir)
		}
		t.Skipf("ajv not installed: run `npm ci --prefix %s` to check the schemas in strict mode", dir)
	}
	out, err := exec.Command(node, filepath.Join(dir, "check.js"), "schema").CombinedOutput()
	if err != nil {
		t.Fatalf("ajv strict mode refused the schemas: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
