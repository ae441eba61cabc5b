package docs

import (
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/effectline/effectline/"

// TestPackagePictureIsCurrent holds the picture of packages in design.md
// ("Packages and the direction of their imports") to the code: every
// package of the module is on it once, each with exactly the effectline
// packages it imports (tests left out), and every import points to a floor
// below its importer's, or to a package on the same floor written with a
// leading "→". Floors are separated by blank lines, the top floor first;
// a line is `package: imports…  # what it holds`.
func TestPackagePictureIsCurrent(t *testing.T) {
	actual := moduleImports(t)
	b, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```imports\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("design.md has no ```imports block")
	}
	floorOf := map[string]int{}
	listed := map[string][]string{}
	floor := 0
	for _, line := range strings.Split(string(m[1]), "\n") {
		if strings.TrimSpace(line) == "" {
			floor++
			continue
		}
		line, _, _ = strings.Cut(line, "#") // what follows # describes the package
		pkg, deps, ok := strings.Cut(line, ":")
		if !ok {
			t.Errorf("line %q: want `package: imports…`", line)
			continue
		}
		pkg = strings.TrimSpace(pkg)
		if _, dup := floorOf[pkg]; dup {
			t.Errorf("%s is on the picture twice", pkg)
		}
		floorOf[pkg] = floor
		listed[pkg] = strings.Fields(deps)
	}
	for pkg, deps := range listed {
		want, ok := actual[pkg]
		if !ok {
			t.Errorf("%s is on the picture but is not a package of the module", pkg)
			continue
		}
		var got []string
		for _, d := range deps {
			same := strings.HasPrefix(d, "→")
			d = strings.TrimPrefix(d, "→")
			got = append(got, d)
			df, ok := floorOf[d]
			switch {
			case !ok:
				t.Errorf("%s imports %s, which is not on the picture", pkg, d)
			case same && df != floorOf[pkg]:
				t.Errorf("%s → %s is marked as an import within a floor, but they are on different floors", pkg, d)
			case !same && df <= floorOf[pkg]:
				t.Errorf("%s imports %s on its own floor or above (mark it → if it is meant to be on the same floor)", pkg, d)
			}
		}
		sort.Strings(got)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: the picture says it imports [%s], the code [%s]", pkg, strings.Join(got, " "), strings.Join(want, " "))
		}
	}
	var missing []string
	for pkg, deps := range actual {
		if _, ok := listed[pkg]; !ok {
			missing = append(missing, pkg+": "+strings.Join(deps, " "))
		}
	}
	sort.Strings(missing)
	for _, l := range missing {
		t.Errorf("not on the picture: %s", l)
	}
}

// moduleImports returns each package of the module (short names, without
// the module path) and the module's packages it imports, sorted.
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{if .GoFiles}}{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{end}}`, "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue // a package of tests only
		}
		name := strings.TrimPrefix(f[0], module)
		if strings.HasPrefix(name, "internal/testenv") {
			continue // test support, imported by tests only
		}
		deps := []string{}
		for _, d := range f[1:] {
			if strings.HasPrefix(d, module) {
				deps = append(deps, strings.TrimPrefix(d, module))
			}
		}
		sort.Strings(deps)
		pkgs[name] = deps
	}
	return pkgs
}
