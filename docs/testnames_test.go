package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// testName matches the name of a Go test, fuzz test or benchmark.
var testName = regexp.MustCompile(`\b(?:Test|Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*\b`)

// TestNamedTestsExist fails when the documentation names a test that no
// _test.go file defines: a test renamed or removed leaves its proof
// behind in the prose. benchmarks.md is a journal of past sessions, where
// a name is what it was then, and is not checked.
func TestNamedTestsExist(t *testing.T) {
	defined := map[string]bool{}
	for _, f := range trackedFiles(t, "_test.go") {
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`).FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
	}
	for _, f := range trackedFiles(t, ".md") {
		if strings.HasSuffix(f, "benchmarks.md") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, name := range testName.FindAllString(line, -1) {
				if !defined[name] && !(strings.Contains(line, "-run") && prefixOfAny(name, defined)) {
					t.Errorf("%s names %s, which no test file defines", f, name)
				}
			}
		}
	}
}

// prefixOfAny reports whether p begins some name in names: a go test -run
// pattern such as 'TestFault(A|B)' names tests by their beginning.
func prefixOfAny(p string, names map[string]bool) bool {
	for n := range names {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}
