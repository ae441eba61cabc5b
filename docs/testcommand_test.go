package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheSuiteCommandIsTheSameEverywhere: CI runs exactly the README's test
// command, so the line is written four times (README.md, .ci/run, the
// Makefile's test target, docs/testing.md). A change made in some of them
// would leave the README promising what CI does not run.
func TestTheSuiteCommandIsTheSameEverywhere(t *testing.T) {
	readme := suiteCommand(t, "README.md")
	others := map[string]string{
		".ci/run":         suiteCommand(t, ".ci/run"),
		"docs/testing.md": suiteCommand(t, "docs/testing.md"),
		// make reads $$ as one $.
		"Makefile": strings.ReplaceAll(suiteCommand(t, "Makefile"), "$$", "$"),
	}
	for name, line := range others {
		if line != readme {
			t.Errorf("%s runs\n\t%s\nbut the README says\n\t%s", name, line, readme)
		}
	}
	// The fuzz budget is a count: a duration can fail a target that found
	// nothing on Go 1.26 (golang/go#75804; docs/testing.md, "Fuzzing").
	fields := strings.Fields(readme)
	for i, f := range fields {
		if f == "-fuzztime" && (i+1 == len(fields) || !strings.HasSuffix(fields[i+1], "x")) {
			t.Errorf("the README's fuzz budget is not a count (Nx): %s", readme)
		}
	}
}

// suiteCommand returns the first line of the repository's file name that
// starts "go test -race ", without its indentation.
func suiteCommand(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", name))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimLeft(l, " \t"); strings.HasPrefix(l, "go test -race ") {
			return l
		}
	}
	t.Fatalf("%s has no line starting \"go test -race \"", name)
	return ""
}
