package workflow

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/effectline/effectline/tool/httptool"
)

// TestToolsFileReference checks that docs/tools-file.md names every key of
// a workflow and a step the loader decodes, and no other under
// workflows[] (package httptool's test checks the tools' keys).
func TestToolsFileReference(t *testing.T) {
	b, err := os.ReadFile("../docs/tools-file.md")
	if err != nil {
		t.Fatal(err)
	}
	var ref []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(workflows[a-z_.\\[\\]]*)` \\|").FindAllStringSubmatch(string(b), -1) {
		ref = append(ref, m[1])
	}
	loader := yamlKeys(reflect.TypeFor[fileDoc](), "")
	if len(loader) < 2 {
		t.Fatalf("no keys derived from fileDoc: %v", loader)
	}
	for _, k := range loader {
		if !slices.Contains(ref, k) {
			t.Errorf("the loader accepts %s, docs/tools-file.md does not name it", k)
		}
	}
	for _, k := range ref {
		if !slices.Contains(loader, k) {
			t.Errorf("docs/tools-file.md names %s, the loader does not accept it", k)
		}
	}
}

// TestToolsFileReferenceExample loads the complete file that opens
// docs/tools-file.md, tools and workflows, so the example cannot rot.
func TestToolsFileReferenceExample(t *testing.T) {
	b, err := os.ReadFile("../docs/tools-file.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/tools-file.md has no yaml example")
	}
	getenv := func(name string) string {
		if name == "PSP_SIGNING_SECRET" {
			return "whsec_c2VjcmV0LXRoYXQtaXMtbG9uZy1lbm91Z2g="
		}
		return ""
	}
	reg, err := httptool.Parse([]byte(example), getenv)
	if err != nil {
		t.Fatalf("the tools of the example do not load: %v", err)
	}
	set, err := Parse([]byte(example), reg)
	if err != nil {
		t.Fatalf("the workflows of the example do not load: %v", err)
	}
	if len(reg.Names()) != 3 || len(set.Names()) != 1 {
		t.Errorf("the example loads %v and %v, want 3 tools and 1 workflow", reg.Names(), set.Names())
	}
}

// yamlKeys lists the key paths a type decodes, from its yaml tags (see the
// same function in tool/httptool's test).
func yamlKeys(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := prefix + name
		out = append(out, path)
		ft := f.Type
		list := ""
		if ft.Kind() == reflect.Slice {
			ft, list = ft.Elem(), "[]"
		}
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			out = append(out, yamlKeys(ft, path+list+".")...)
		}
	}
	return out
}
