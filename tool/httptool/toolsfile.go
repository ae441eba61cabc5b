package httptool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/policy"
	"github.com/effectline/effectline/tool"
)

// The tools file (contract §6). Its shape is contract; keys may be added.
type toolsFile struct {
	Tools []toolEntry `yaml:"tools"`
	// Workflows are read and checked by package workflow, against the
	// registry this file builds.
	Workflows any `yaml:"workflows"`
}

type toolEntry struct {
	Name              string         `yaml:"name"`
	Description       string         `yaml:"description"`
	Effect            string         `yaml:"effect"`
	Invoke            *endpointEntry `yaml:"invoke"`
	IdempotencyHeader string         `yaml:"idempotency_header"`
	Reconcile         *endpointEntry `yaml:"reconcile"`
	Compensate        *endpointEntry `yaml:"compensate"`
	Retry             *retryEntry    `yaml:"retry"`
	ArgsSchema        any            `yaml:"args_schema"`
	AllowedPrincipals []string       `yaml:"allowed_principals"`
	RequiresApproval  bool           `yaml:"requires_approval"`
	SigningSecretEnv  string         `yaml:"signing_secret_env"`
	AllowedHosts      []string       `yaml:"allowed_hosts"`
	DownstreamIDField string         `yaml:"downstream_id_field"`
	MaxResponseBytes  *int64         `yaml:"max_response_bytes"`
	DedupWindow       string         `yaml:"dedup_window"`
	// Precondition and Approval are the execution-time guards; see
	// preconditionEntry and approvalEntry.
	Precondition *preconditionEntry `yaml:"precondition"`
	Approval     *approvalEntry     `yaml:"approval"`
}

// preconditionEntry is a tool's precondition: a request run before every
// attempt (method, url, timeout as for reconcile; method defaults to GET)
// and expect, a JSON Schema its 2xx body must match. In expect, a string
// that is exactly one template action ("{{.Args.amount}}", "{{.Principal}}",
// also .Key, .OperationKey, .DownstreamID) is replaced by that value with
// its JSON type, so {minimum: "{{.Args.amount}}"} compares numbers. A body
// that does not match, or a 404, fails the operation for good with
// precondition_failed; any other answer is a retryable failure.
type preconditionEntry struct {
	endpointEntry `yaml:",inline"`
	Expect        any `yaml:"expect"`
}

// approvalEntry is a tool's approval gate: when (a JSON Schema on the args;
// absent means every call) decides whether the first attempt waits;
// approvers (default 1) distinct approvers must decide retry; not_requester
// (default true) refuses a decision by the principal that submitted the
// intent. requires_approval: true is the same as approval: {}.
type approvalEntry struct {
	When         any   `yaml:"when"`
	Approvers    *int  `yaml:"approvers"`
	NotRequester *bool `yaml:"not_requester"`
}

type endpointEntry struct {
	Method  string `yaml:"method"`
	URL     string `yaml:"url"`
	Timeout string `yaml:"timeout"`
}

type retryEntry struct {
	MaxAttempts *int   `yaml:"max_attempts"`
	BaseDelay   string `yaml:"base_delay"`
	MaxDelay    string `yaml:"max_delay"`
	Deadline    string `yaml:"deadline"`
}

// knownKeys lists the keys of each mapping, for errors that name the tool
// (yaml's own strict mode only names a line and a Go type).
var knownKeys = map[string][]string{
	"tool": {"name", "description", "effect", "invoke", "idempotency_header", "reconcile", "compensate",
		"retry", "args_schema", "allowed_principals", "requires_approval", "signing_secret_env",
		"allowed_hosts", "downstream_id_field", "max_response_bytes", "dedup_window", "precondition", "approval"},
	"endpoint":     {"method", "url", "timeout"},
	"precondition": {"method", "url", "timeout", "expect"},
	"approval":     {"when", "approvers", "not_requester"},
	"retry":        {"max_attempts", "base_delay", "max_delay", "deadline"},
}

// inlineSecretKey matches keys that look like a secret written into the
// file. Secrets live in the environment; the file is committed, reviewed and
// shipped in images.
var inlineSecretKey = regexp.MustCompile(`(?i)secret|token|password|passwd|api_?key|credential|private_key`)

var methods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Load reads the tools file at path; see Parse. Errors name the file.
func Load(path string, getenv func(string) string) (*tool.Registry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loading tools: %w", err)
	}
	return parseFile(path, data, getenv)
}

// Parse builds a registry of HTTP tools from a tools file (contract §6).
//
// It refuses anything doubtful at load rather than at the first call: an
// unknown key (a typo would silently drop a setting), an unknown effect
// class, a compensable tool without compensate, a secret written inline, a
// URL template that does not parse or names a host outside allowed_hosts,
// a non-positive timeout or cap, an args_schema that does not compile, a
// signing_secret_env whose variable is unset, a precondition without expect
// or whose expect does not compile (or holds a template action that is not
// the whole string, or names anything but .Args.<field>, .Principal, .Key,
// .OperationKey or .DownstreamID), an approval with fewer than one approver
// or a when that does not compile.
//
// The execution-time guards are two keys of a tool: precondition (see
// preconditionEntry) and approval (see approvalEntry). Every problem is reported,
// each as a *ConfigError naming the tool and the key, joined with
// errors.Join.
//
// getenv reads the signing secrets; nil means an empty environment. Only
// cmd reads the real environment (only cmd does), so it passes os.Getenv.
func Parse(data []byte, getenv func(string) string) (*tool.Registry, error) {
	return parseFile("", data, getenv)
}

func parseFile(file string, data []byte, getenv func(string) string) (*tool.Registry, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	p := &fileParser{file: file, getenv: getenv}
	reg := p.parse(data)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return reg, nil
}

type fileParser struct {
	file   string
	getenv func(string) string
	errs   []error
}

func (p *fileParser) fail(name, key, reason string, err error) {
	p.errs = append(p.errs, &tool.ConfigError{File: p.file, Tool: name, Key: key, Reason: reason, Err: err})
}

func (p *fileParser) parse(data []byte) *tool.Registry {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.fail("", "", "not valid YAML", err)
		return nil
	}
	if len(doc.Content) == 0 {
		p.fail("", "tools", "required", nil)
		return nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		p.fail("", "", "must be a mapping with a tools list", nil)
		return nil
	}
	var toolsNode *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch k := root.Content[i].Value; k {
		case "tools":
			toolsNode = root.Content[i+1]
		case "workflows":
		default:
			p.fail("", k, "unknown key", nil)
		}
	}
	if toolsNode == nil {
		p.fail("", "tools", "required", nil)
		return nil
	}
	if toolsNode.Kind != yaml.SequenceNode && toolsNode.Tag != "!!null" {
		p.fail("", "tools", "must be a list of tools", nil)
		return nil
	}

	reg := tool.NewRegistry()
	seen := map[string]int{}
	for i, n := range toolsNode.Content {
		id := fmt.Sprintf("#%d", i+1)
		if n.Kind != yaml.MappingNode {
			p.fail(id, "", "must be a mapping", nil)
			continue
		}
		if name := scalarValue(n, "name"); name != "" {
			id = name
		}
		before := len(p.errs)
		p.checkKeys(id, "", n, "tool")
		if len(p.errs) > before {
			continue
		}
		var e toolEntry
		if err := n.Decode(&e); err != nil {
			p.fail(id, "", "malformed", err)
			continue
		}
		if e.Name != "" {
			if first, dup := seen[e.Name]; dup {
				p.fail(id, "name", fmt.Sprintf("duplicate tool name (first defined as tool #%d)", first), nil)
				continue
			}
			seen[e.Name] = i + 1
		}
		t := p.build(id, &e)
		if t == nil {
			continue
		}
		if err := reg.Register(t); err != nil {
			p.fail(id, "", "cannot register", err)
		}
	}

	// Belt and braces: yaml's own strict decoding of the whole file, so the
	// key lists above cannot drift from the structs unnoticed.
	if len(p.errs) == 0 {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		var f toolsFile
		if err := dec.Decode(&f); err != nil {
			p.fail("", "", "strict decoding", err)
		}
	}
	return reg
}

// checkKeys reports inline secrets and unknown keys of mapping n, and
// recurses into the nested mappings it knows (never into args_schema, whose
// property names are the tool's business: a "password" argument is fine).
func (p *fileParser) checkKeys(name, prefix string, n *yaml.Node, shape string) {
	known := knownKeys[shape]
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		key := prefix + k
		switch {
		case k == "signing_secret_env":
		case inlineSecretKey.MatchString(k):
			p.fail(name, key, "secrets must not be written in the tools file; put the secret in an environment variable and name it in signing_secret_env", nil)
			continue
		case !slices.Contains(known, k):
			p.fail(name, key, "unknown key", nil)
			continue
		}
		if v.Kind != yaml.MappingNode {
			continue
		}
		switch {
		case shape == "tool" && (k == "invoke" || k == "compensate" || k == "reconcile"):
			p.checkKeys(name, key+".", v, "endpoint")
		case shape == "tool" && k == "retry":
			p.checkKeys(name, key+".", v, "retry")
		case shape == "tool" && (k == "precondition" || k == "approval"):
			// Not into expect or when: schemas name what they like.
			p.checkKeys(name, key+".", v, k)
		}
	}
}

// build validates one tool entry and returns its HTTPTool, or nil after
// reporting what is wrong.
func (p *fileParser) build(id string, e *toolEntry) *HTTPTool {
	before := len(p.errs)
	if e.Name == "" {
		p.fail(id, "name", "required", nil)
	}
	effect := events.EffectClass(e.Effect)
	switch {
	case e.Effect == "":
		p.fail(id, "effect", "required (idempotent, compensable or irreversible)", nil)
	case !effect.Valid():
		p.fail(id, "effect", fmt.Sprintf("unknown effect class %q (want idempotent, compensable or irreversible)", e.Effect), nil)
	}

	t := &HTTPTool{idField: tool.DefaultDownstreamIDField, maxBody: DefaultMaxResponseBytes}
	var urls []struct {
		key string
		ut  *urlTemplate
	}
	endpointOf := func(key string, ee *endpointEntry, method string) *endpoint {
		if ee == nil {
			return nil
		}
		ep := &endpoint{method: method, timeout: DefaultTimeout}
		if ee.Method != "" {
			ep.method = strings.ToUpper(ee.Method)
			if !methods[ep.method] {
				p.fail(id, key+".method", fmt.Sprintf("unsupported method %q", ee.Method), nil)
			}
		}
		if ee.Timeout != "" {
			d, err := time.ParseDuration(ee.Timeout)
			switch {
			case err != nil:
				p.fail(id, key+".timeout", fmt.Sprintf("not a duration: %q", ee.Timeout), nil)
			case d <= 0:
				p.fail(id, key+".timeout", fmt.Sprintf("must be positive, got %s", ee.Timeout), nil)
			default:
				ep.timeout = d
			}
		}
		ut, err := parseURLTemplate(ee.URL)
		if err != nil {
			p.fail(id, key+".url", err.Error(), nil)
		} else {
			ep.url = ut
			urls = append(urls, struct {
				key string
				ut  *urlTemplate
			}{key + ".url", ut})
		}
		return ep
	}

	if e.Invoke == nil {
		p.fail(id, "invoke", "required", nil)
	} else if ep := endpointOf("invoke", e.Invoke, "POST"); ep != nil {
		t.invoke = *ep
	}
	t.compensate = endpointOf("compensate", e.Compensate, "POST")
	t.reconcile = endpointOf("reconcile", e.Reconcile, "GET")
	if pe := e.Precondition; pe != nil {
		if ep := endpointOf("precondition", &pe.endpointEntry, "GET"); ep != nil {
			pre, err := parsePrecondition(*ep, pe.Expect)
			if err != nil {
				p.fail(id, "precondition", err.Error(), nil)
			}
			t.precondition = pre
		}
	}
	approval := p.approval(id, e)
	switch {
	case effect == events.Compensable && e.Compensate == nil:
		p.fail(id, "compensate", "required for a compensable tool", nil)
	case effect.Valid() && effect != events.Compensable && e.Compensate != nil:
		p.fail(id, "compensate", fmt.Sprintf("only a compensable tool is compensated, this one is %s", effect), nil)
	}

	// Hosts: the tool may only talk to the hosts it names.
	t.allowedHosts = map[string]bool{}
	for i, h := range e.AllowedHosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" || strings.ContainsAny(h, "/?#@ ") {
			p.fail(id, fmt.Sprintf("allowed_hosts[%d]", i), fmt.Sprintf("not a host: %q", e.AllowedHosts[i]), nil)
			continue
		}
		t.allowedHosts[h] = true
	}
	explicitHosts := len(e.AllowedHosts) > 0
	for _, u := range urls {
		if u.ut.hostTemplated {
			if !explicitHosts {
				p.fail(id, u.key, "the host comes from the template; list the hosts it may take in allowed_hosts", nil)
			}
			continue
		}
		if !explicitHosts {
			t.allowedHosts[strings.ToLower(u.ut.host)] = true
		}
	}
	if explicitHosts {
		for _, u := range urls {
			if !u.ut.hostTemplated && !t.hostAllowed(u.ut.host, hostnameOf(u.ut.host)) {
				p.fail(id, u.key, fmt.Sprintf("host %q is not in allowed_hosts", u.ut.host), nil)
			}
		}
	}

	caps := policy.Caps{}
	if r := e.Retry; r != nil {
		if r.MaxAttempts != nil {
			if *r.MaxAttempts < 1 {
				p.fail(id, "retry.max_attempts", fmt.Sprintf("must be at least 1, got %d", *r.MaxAttempts), nil)
			}
			caps.MaxAttempts = *r.MaxAttempts
		}
		for _, d := range []struct {
			key string
			raw string
			dst *time.Duration
		}{{"base_delay", r.BaseDelay, &caps.BaseDelay}, {"max_delay", r.MaxDelay, &caps.MaxDelay}, {"deadline", r.Deadline, &caps.Deadline}} {
			if d.raw == "" {
				continue
			}
			v, err := time.ParseDuration(d.raw)
			switch {
			case err != nil:
				p.fail(id, "retry."+d.key, fmt.Sprintf("not a duration: %q", d.raw), nil)
			case v <= 0:
				p.fail(id, "retry."+d.key, fmt.Sprintf("must be positive, got %s", d.raw), nil)
			default:
				*d.dst = v
			}
		}
	}
	caps = caps.WithDefaults()
	if err := caps.Validate(); err != nil && len(p.errs) == before {
		var ce *policy.CapsError
		if errors.As(err, &ce) {
			p.fail(id, "retry."+ce.Field, ce.Reason, nil)
		} else {
			p.fail(id, "retry", err.Error(), nil)
		}
	}

	var schema json.RawMessage
	if e.ArgsSchema != nil {
		raw, err := yamlToJSON(e.ArgsSchema)
		if err != nil {
			p.fail(id, "args_schema", "cannot be expressed as JSON", err)
		} else if err := tool.CheckSchema(raw); err != nil {
			p.fail(id, "args_schema", "invalid JSON Schema", err)
		} else {
			schema = raw
		}
	}

	header := tool.DefaultIdempotencyHeader
	if e.IdempotencyHeader != "" {
		if !validHeaderName(e.IdempotencyHeader) {
			p.fail(id, "idempotency_header", fmt.Sprintf("not a valid header name: %q", e.IdempotencyHeader), nil)
		}
		header = e.IdempotencyHeader
	}
	for i, pr := range e.AllowedPrincipals {
		if strings.TrimSpace(pr) == "" {
			p.fail(id, fmt.Sprintf("allowed_principals[%d]", i), "empty principal", nil)
		}
	}
	if e.DownstreamIDField != "" {
		t.idField = e.DownstreamIDField
	}
	if e.MaxResponseBytes != nil {
		if *e.MaxResponseBytes <= 0 {
			p.fail(id, "max_response_bytes", fmt.Sprintf("must be positive, got %d", *e.MaxResponseBytes), nil)
		}
		t.maxBody = *e.MaxResponseBytes
	}
	var dedup time.Duration
	if e.DedupWindow != "" {
		d, err := time.ParseDuration(e.DedupWindow)
		switch {
		case err != nil:
			p.fail(id, "dedup_window", fmt.Sprintf("not a duration: %q", e.DedupWindow), nil)
		case d <= 0:
			p.fail(id, "dedup_window", fmt.Sprintf("must be positive, got %s", e.DedupWindow), nil)
		default:
			dedup = d
		}
	}
	if e.SigningSecretEnv != "" {
		name := e.SigningSecretEnv
		if !envName.MatchString(name) {
			p.fail(id, "signing_secret_env", fmt.Sprintf("not an environment variable name: %q (write the variable's name, never the secret)", name), nil)
		} else if secret := p.getenv(name); secret == "" {
			p.fail(id, "signing_secret_env", fmt.Sprintf("environment variable %s is not set", name), nil)
		} else if s, err := newSigner(secret); err != nil {
			p.fail(id, "signing_secret_env", fmt.Sprintf("environment variable %s", name), err)
		} else {
			t.signer = s
		}
	}
	if len(p.errs) > before {
		return nil
	}

	t.spec = tool.Spec{
		Name:              e.Name,
		Description:       e.Description,
		Effect:            effect,
		Caps:              caps,
		RequiresApproval:  e.RequiresApproval,
		AllowedPrincipals: e.AllowedPrincipals,
		IdempotencyHeader: header,
		CanReconcile:      t.reconcile != nil,
		CanCompensate:     t.compensate != nil,
		Timeout:           t.invoke.timeout,
		ArgsSchema:        schema,
		DedupWindow:       dedup,
		Approval:          approval,
	}
	for _, u := range urls {
		t.spec.AddPathArgs(u.ut.pathArgs...)
	}
	if err := t.spec.Prepare(); err != nil {
		p.fail(id, "", "invalid", err)
		return nil
	}
	t.client = newHTTPClient()
	return t
}

// approval reads a tool's approval key; requires_approval: true without it
// is the simple form (every call, one approver who is not the requester).
func (p *fileParser) approval(id string, e *toolEntry) *tool.Approval {
	a := e.Approval
	if a == nil {
		return nil
	}
	out := &tool.Approval{Approvers: 1, NotRequester: true}
	if a.Approvers != nil {
		if *a.Approvers < 1 {
			p.fail(id, "approval.approvers", fmt.Sprintf("must be at least 1, got %d", *a.Approvers), nil)
		}
		out.Approvers = *a.Approvers
	}
	if a.NotRequester != nil {
		out.NotRequester = *a.NotRequester
	}
	if a.When != nil {
		raw, err := yamlToJSON(a.When)
		if err != nil {
			p.fail(id, "approval.when", "cannot be expressed as JSON", err)
		} else if err := tool.CheckSchema(raw); err != nil {
			p.fail(id, "approval.when", "invalid JSON Schema", err)
		} else {
			out.When = raw
		}
	}
	return out
}

// yamlToJSON turns a decoded YAML value into JSON. YAML allows mapping keys
// that JSON does not; those are an error rather than silently stringified.
func yamlToJSON(v any) (json.RawMessage, error) {
	conv, err := jsonValue(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(conv)
}

func jsonValue(v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("mapping key %v is not a string", k)
			}
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	}
	return v, nil
}

func scalarValue(n *yaml.Node, key string) string {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

// hostnameOf strips a port from host[:port].
func hostnameOf(host string) string {
	if strings.HasPrefix(host, "[") {
		if i := strings.Index(host, "]"); i > 0 {
			return host[1:i]
		}
	}
	if i := strings.LastIndex(host, ":"); i >= 0 && !strings.Contains(host[:i], ":") {
		return host[:i]
	}
	return host
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.ContainsRune("!#$%&'*+-.^_`|~", c):
		default:
			return false
		}
	}
	return true
}
