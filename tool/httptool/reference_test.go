package httptool

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// referenceKeys reads the key column of the Keys table of
// docs/tools-file.md: every row whose first cell is a backquoted key path.
func referenceKeys(t *testing.T) (keys []string, doc string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/tools-file.md")
	if err != nil {
		t.Fatal(err)
	}
	doc = string(b)
	row := regexp.MustCompile("(?m)^\\| `((?:tools|workflows)[a-z_.\\[\\]]*)` \\|")
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		keys = append(keys, m[1])
	}
	if len(keys) == 0 {
		t.Fatal("docs/tools-file.md has no Keys table")
	}
	return keys, doc
}

// yamlKeys lists the key paths a type decodes, from its yaml tags: a list
// of mappings is "key[]", a nested mapping "key.", anything else (a
// string, a schema, args) a leaf.
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

// TestToolsFileReference checks that docs/tools-file.md names every key the
// loader accepts and the loader accepts every key it names. The workflows'
// keys are package workflow's; its own test checks them.
func TestToolsFileReference(t *testing.T) {
	documented, doc := referenceKeys(t)
	var ref []string
	for _, k := range documented {
		if strings.HasPrefix(k, "workflows[]") {
			continue
		}
		ref = append(ref, k)
		// "compensate. and reconcile. take the same three keys as invoke."
		if rest, ok := strings.CutPrefix(k, "tools[].invoke."); ok {
			ref = append(ref, "tools[].compensate."+rest, "tools[].reconcile."+rest)
		}
	}
	loader := yamlKeys(reflect.TypeFor[toolsFile](), "")
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

	// The loader's own key lists (its errors name the tool) agree with
	// the structs it decodes into.
	for shape, typ := range map[string]reflect.Type{
		"tool": reflect.TypeFor[toolEntry](), "endpoint": reflect.TypeFor[endpointEntry](), "retry": reflect.TypeFor[retryEntry](),
	} {
		var top []string
		for _, k := range yamlKeys(typ, "") {
			if !strings.Contains(k, ".") {
				top = append(top, k)
			}
		}
		if got := slices.Sorted(slices.Values(knownKeys[shape])); !slices.Equal(got, slices.Sorted(slices.Values(top))) {
			t.Errorf("knownKeys[%s] = %v, the struct decodes %v", shape, got, top)
		}
	}

	// Template fields: what templates see, what the errors list, what the
	// reference describes.
	data := reflect.TypeFor[templateData]()
	if data.NumField() != len(TemplateFields) {
		t.Fatalf("templateData has %d fields, TemplateFields %d", data.NumField(), len(TemplateFields))
	}
	for i, f := range TemplateFields {
		if got := data.Field(i).Name; got != f.Name {
			t.Errorf("TemplateFields[%d] is %s, templateData's field %s", i, f.Name, got)
		}
		if !strings.Contains(doc, "| `."+f.Name+"` |") {
			t.Errorf("docs/tools-file.md does not describe the template field .%s", f.Name)
		}
	}
}
