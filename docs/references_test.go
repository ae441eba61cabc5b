// Package docs holds checks that keep the documentation true to the code;
// it has no code of its own.
package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// trackedFiles lists the repository's tracked files with one of endings.
func trackedFiles(t *testing.T, endings ...string) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", "..", "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (the check reads a git checkout)", err)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		for _, e := range endings {
			if strings.HasSuffix(f, e) {
				files = append(files, f)
				break
			}
		}
	}
	return files
}

// contractSections returns the numbers of docs/contract.md's "## N." headings.
func contractSections(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("contract.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, h := range regexp.MustCompile(`(?m)^## (\d+)\. `).FindAllStringSubmatch(string(b), -1) {
		out[h[1]] = true
	}
	return out
}

var (
	// sectionRef is a "§n" reference; a dotted number (§3.2.2) is a section
	// of another document (an RFC), never of the contract.
	sectionRef = regexp.MustCompile(`§(\d+)(\.\d)?`)
	// rfcNear marks a line whose "§n" belong to an RFC ("RFC 8785 §3").
	rfcNear = regexp.MustCompile(`RFC \d+`)
	// unshipped names documents the repository does not carry.
	unshipped = regexp.MustCompile(`\bDESIGN(\.md)?\b|\bSTYLE (§|\d)|shared/DESIGN|shared/STYLE`)
)

// TestSectionReferencesResolve keeps every "§n" in the code, the docs and
// the OpenAPI document pointing at a section of docs/contract.md that
// exists, and keeps out references to the design card the project started
// from, which is not shipped: a reader could follow neither.
func TestSectionReferencesResolve(t *testing.T) {
	sections := contractSections(t)
	if len(sections) < 16 {
		t.Fatalf("docs/contract.md has %d numbered sections; want 16", len(sections))
	}
	checked := 0
	for _, f := range trackedFiles(t, ".go", ".md", ".json", ".yaml", ".yml", ".html", ".sh") {
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			if unshipped.MatchString(line) {
				t.Errorf("%s:%d refers to a document the repository does not ship: %s", f, n+1, strings.TrimSpace(line))
			}
			if rfcNear.MatchString(line) {
				continue
			}
			for _, m := range sectionRef.FindAllStringSubmatch(line, -1) {
				if m[2] != "" {
					continue
				}
				checked++
				if !sections[m[1]] {
					t.Errorf("%s:%d: §%s is not a section of docs/contract.md: %s", f, n+1, m[1], strings.TrimSpace(line))
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d references checked: is the file list right?", checked)
	}
}
