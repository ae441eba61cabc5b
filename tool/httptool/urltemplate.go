package httptool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"text/template"
	"text/template/parse"

	"github.com/effectline/effectline/tool"
)

// urlTemplate is a tool URL with text/template actions over templateData.
//
// Values are escaped automatically: an action before the first '?' goes
// through url.PathEscape, one after it through url.QueryEscape, unless the
// action already ends in urlquery, pathescape or raw. So a downstream key
// such as "order 7~c1" cannot break out of its query parameter or path
// segment, and a template author does not have to remember to escape.
// "raw" opts out, for a value that is itself a URL fragment.
type urlTemplate struct {
	text string
	tmpl *template.Template
	// hostTemplated is true when the host itself comes from an action, so
	// the host can only be checked per request.
	hostTemplated bool
	// host is the literal host (host[:port]) when it is not templated.
	host string
	// pathArgs are the args printed in the URL's path, each as its field
	// path under .Args ({{.Args.order}} is ["order"]): see checkPathArgs.
	pathArgs [][]string
}

// templateData is what URL templates see (contract §6); TemplateFields
// describes its fields.
type templateData struct {
	Key          string
	OperationKey string
	DownstreamID string
	Args         map[string]any
}

var urlFuncs = template.FuncMap{
	"pathescape": func(v any) string { return url.PathEscape(fmt.Sprint(v)) },
	"queryescape": func(v any) string {
		return url.QueryEscape(fmt.Sprint(v))
	},
	"raw": func(v any) string { return fmt.Sprint(v) },
}

// parseURLTemplate parses text, adds the escaping, and checks the URL's
// shape by rendering it once with placeholder data.
func parseURLTemplate(text string) (*urlTemplate, error) {
	if strings.TrimSpace(text) == "" {
		return nil, errors.New("url is required")
	}
	tmpl, err := template.New("url").Funcs(urlFuncs).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("not a valid template: %w", err)
	}
	ut := &urlTemplate{text: text, tmpl: tmpl, pathArgs: autoEscape(tmpl.Tree)}
	scheme, rest, ok := strings.Cut(text, "://")
	if !ok || strings.Contains(scheme, "{{") {
		return nil, errors.New("must be an absolute http or https URL")
	}
	if s := strings.ToLower(scheme); s != "http" && s != "https" {
		return nil, fmt.Errorf("scheme %q is not http or https", scheme)
	}
	hostPart := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		hostPart = rest[:i]
	}
	if strings.Contains(hostPart, "{{") {
		ut.hostTemplated = true
	} else {
		u, err := url.Parse(scheme + "://" + hostPart)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("no valid host in %q", text)
		}
		if u.User != nil {
			return nil, errors.New("credentials must not be written in the URL")
		}
		ut.host = u.Host
	}

	if err := checkFields(tmpl.Tree); err != nil {
		return nil, err
	}
	// Render once with placeholders, tolerating missing args, to catch
	// what checkFields cannot see at load.
	check, err := template.New("url").Funcs(urlFuncs).Option("missingkey=zero").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("not a valid template: %w", err)
	}
	_ = autoEscape(check.Tree)
	var buf bytes.Buffer
	sample := templateData{Key: "key", OperationKey: "op", DownstreamID: "id", Args: map[string]any{}}
	if err := check.Execute(&buf, sample); err != nil {
		return nil, fmt.Errorf("template does not render: %w", err)
	}
	if !ut.hostTemplated {
		if _, err := url.Parse(buf.String()); err != nil {
			return nil, fmt.Errorf("does not render to a URL: %w", err)
		}
	}
	return ut, nil
}

// render executes the template for one call and parses the result.
func (ut *urlTemplate) render(c tool.Call) (*url.URL, error) {
	data := templateData{Key: c.DownstreamKey, OperationKey: c.OperationKey, DownstreamID: c.DownstreamID}
	if len(bytes.TrimSpace(c.Args)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(c.Args))
		dec.UseNumber()
		if err := dec.Decode(&data.Args); err != nil {
			return nil, fmt.Errorf("args for the URL template: %w", err)
		}
	}
	var buf bytes.Buffer
	if err := ut.tmpl.Execute(&buf, data); err != nil {
		return nil, fmt.Errorf("rendering URL template: %w", err)
	}
	u, err := url.Parse(buf.String())
	if err != nil {
		return nil, fmt.Errorf("rendered URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("rendered URL %q is not an absolute http(s) URL", u.Redacted())
	}
	return u, nil
}

// autoEscape appends pathescape or queryescape to every action that prints
// a value, by its position in the URL. Text after a '?' or '#' is query (or
// fragment) position; the walk follows the template's own order, so an
// action inside {{if}} is escaped for where it lands.
//
// It returns the args printed in path position, for checkPathArgs.
func autoEscape(tree *parse.Tree) (pathArgs [][]string) {
	inQuery := false
	var walk func(list *parse.ListNode)
	walk = func(list *parse.ListNode) {
		if list == nil {
			return
		}
		for _, n := range list.Nodes {
			switch n := n.(type) {
			case *parse.TextNode:
				if bytes.ContainsAny(n.Text, "?#") {
					inQuery = true
				}
			case *parse.ActionNode:
				if len(n.Pipe.Decl) > 0 {
					continue // {{$x := ...}} prints nothing
				}
				if !inQuery {
					if f := argsField(n); f != nil {
						pathArgs = append(pathArgs, f)
					}
				}
				escapeAction(tree, n, inQuery)
			case *parse.IfNode:
				walk(n.List)
				walk(n.ElseList)
			case *parse.RangeNode:
				walk(n.List)
				walk(n.ElseList)
			case *parse.WithNode:
				walk(n.List)
				walk(n.ElseList)
			}
		}
	}
	walk(tree.Root)
	return pathArgs
}

// TemplateFields are the fields a URL template may name, with what each
// holds: the tools-file reference (docs/tools-file.md) lists the same.
var TemplateFields = []struct{ Name, Holds string }{
	{"Key", "the downstream key: the idempotency key to send, unique per effect (a compensated retry gets a new one)"},
	{"OperationKey", "the operation key the agent chose"},
	{"DownstreamID", "the id the downstream returned for the effect (compensate and reconcile; empty before it is known)"},
	{"Args", "the intent's args, a JSON object: .Args.NAME is one of them"},
}

// checkFields refuses a field that templates do not have ({{.Argz.x}}),
// listing the ones they do: text/template's own error names an internal
// type. Only actions where dot is the template data are checked; inside
// range and with, dot is something else.
func checkFields(tree *parse.Tree) error {
	known := map[string]bool{}
	for _, f := range TemplateFields {
		known[f.Name] = true
	}
	var bad string
	var pipe func(p *parse.PipeNode)
	pipe = func(p *parse.PipeNode) {
		if p == nil {
			return
		}
		for _, c := range p.Cmds {
			for _, a := range c.Args {
				switch a := a.(type) {
				case *parse.FieldNode:
					if bad == "" && !known[a.Ident[0]] {
						bad = a.String()
					}
				case *parse.PipeNode:
					pipe(a)
				}
			}
		}
	}
	var walk func(list *parse.ListNode)
	walk = func(list *parse.ListNode) {
		if list == nil {
			return
		}
		for _, n := range list.Nodes {
			switch n := n.(type) {
			case *parse.ActionNode:
				pipe(n.Pipe)
			case *parse.IfNode:
				pipe(n.Pipe)
				walk(n.List)
				walk(n.ElseList)
			case *parse.RangeNode:
				pipe(n.Pipe)
				walk(n.ElseList)
			case *parse.WithNode:
				pipe(n.Pipe)
				walk(n.ElseList)
			}
		}
	}
	walk(tree.Root)
	if bad == "" {
		return nil
	}
	names := make([]string, len(TemplateFields))
	for i, f := range TemplateFields {
		names[i] = "." + f.Name
	}
	names[len(names)-1] += ".NAME"
	return fmt.Errorf("{{%s}} is not a template field; the fields are %s (docs/tools-file.md)", bad, strings.Join(names, ", "))
}

// argsField returns the field path under .Args that an action prints
// ({{.Args.order}}, {{.Args.order | pathescape}}), or nil.
func argsField(n *parse.ActionNode) []string {
	if len(n.Pipe.Cmds) == 0 || len(n.Pipe.Cmds[0].Args) == 0 {
		return nil
	}
	f, ok := n.Pipe.Cmds[0].Args[0].(*parse.FieldNode)
	if !ok || len(f.Ident) < 2 || f.Ident[0] != "Args" {
		return nil
	}
	return f.Ident[1:]
}

func escapeAction(tree *parse.Tree, n *parse.ActionNode, inQuery bool) {
	cmds := n.Pipe.Cmds
	if len(cmds) > 0 && len(cmds[len(cmds)-1].Args) > 0 {
		if id, ok := cmds[len(cmds)-1].Args[0].(*parse.IdentifierNode); ok {
			switch id.Ident {
			case "urlquery", "pathescape", "queryescape", "raw":
				return
			}
		}
	}
	fn := "pathescape"
	if inQuery {
		fn = "queryescape"
	}
	ident := parse.NewIdentifier(fn).SetTree(tree).SetPos(n.Pos)
	n.Pipe.Cmds = append(cmds, &parse.CommandNode{NodeType: parse.NodeCommand, Pos: n.Pos, Args: []parse.Node{ident}})
}
