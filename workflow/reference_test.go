package workflow

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
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
