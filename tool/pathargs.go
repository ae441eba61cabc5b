package tool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// AddPathArgs records args that the tool's URL templates print into a URL
// path, each as its field path under .Args ({{.Args.order}} is ["order"]);
// ValidateArgs then refuses values that would make such a segment empty,
// "." or "..". The tools-file loader calls it for every URL it parses.
func (s *Spec) AddPathArgs(paths ...[]string) { s.pathArgs = append(s.pathArgs, paths...) }

// checkPathArgs refuses args that would render a path segment of their
// own as "", "." or "..": /orders/{{.Args.order}} with order ".." is
// /orders/.., which a receiver that normalizes paths serves as the parent
// collection. path escaping leaves dots alone, and an empty value leaves an
// empty segment, so the values themselves are refused, at intake, before
// any request is built. It returns the JSON pointer of the offending arg.
func checkPathArgs(pathArgs [][]string, args json.RawMessage) (field string, err error) {
	if len(pathArgs) == 0 {
		return "", nil
	}
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	if dec.Decode(&doc) != nil {
		return "", nil // not an object: the shape check says so
	}
	for _, p := range pathArgs {
		var v any = doc
		for _, name := range p {
			m, ok := v.(map[string]any)
			if !ok {
				v = nil
				break
			}
			if v, ok = m[name]; !ok {
				break
			}
		}
		if v == nil {
			continue // absent: rendering refuses it (missingkey=error)
		}
		switch fmt.Sprint(v) {
		case "", ".", "..":
			return "/" + strings.Join(p, "/"), errors.New(`is rendered into a URL path segment, which must not be empty, "." or ".."`)
		}
	}
	return "", nil
}
