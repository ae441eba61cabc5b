package httptool

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/policy"
	"github.com/effectline/effectline/tool"
)

func TestLoadDesignExample(t *testing.T) {
	t.Parallel()
	reg, err := Load("testdata/tools.yaml", nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := strings.Join(reg.Names(), ","); got != "inventory.reserve,payments.charge" {
		t.Fatalf("Names() = %s", got)
	}

	tl, ok := reg.Get("payments.charge")
	if !ok {
		t.Fatal("payments.charge missing")
	}
	charge := tl.(*HTTPTool)
	s := charge.Spec()
	wantCaps := policy.Caps{MaxAttempts: 4, BaseDelay: 200 * time.Millisecond, MaxDelay: 5 * time.Second, Deadline: 30 * time.Second}
	if s.Effect != events.Irreversible || s.Caps != wantCaps || s.IdempotencyHeader != "Idempotency-Key" ||
		!s.CanReconcile || s.CanCompensate || s.Timeout != 2*time.Second || s.RequiresApproval ||
		len(s.AllowedPrincipals) != 1 || s.AllowedPrincipals[0] != "billing-agent" {
		t.Fatalf("payments.charge spec = %+v", s)
	}
	if charge.invoke.method != "POST" || charge.reconcile.method != "GET" || charge.reconcile.timeout != DefaultTimeout ||
		charge.maxBody != DefaultMaxResponseBytes || charge.idField != "id" || charge.signer != nil {
		t.Fatalf("payments.charge endpoints = %+v", charge)
	}
	if !charge.allowedHosts["127.0.0.1:9000"] || len(charge.allowedHosts) != 1 {
		t.Fatalf("allowed hosts default to the tool's own: %v", charge.allowedHosts)
	}
	if err := s.ValidateArgs([]byte(`{"amount":0,"currency":"EUR"}`)); !tool.IsArgsError(err) {
		t.Fatalf("args_schema not applied: %v", err)
	}

	tl, _ = reg.Get("inventory.reserve")
	inv := tl.(*HTTPTool)
	if s := inv.Spec(); s.Effect != events.Compensable || !s.CanCompensate || !s.CanReconcile || s.Caps != (policy.Caps{}).WithDefaults() {
		t.Fatalf("inventory.reserve spec = %+v", s)
	}
	if _, ok := reg.Get("nope"); ok {
		t.Fatal("Get found a tool that is not there")
	}
}

// TestParseErrors: one case per validation rule; every message names the
// tool and the key.
func TestParseErrors(t *testing.T) {
	t.Parallel()
	const head = "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"http://127.0.0.1:9000/x\"}\n"
	tests := []struct {
		name string
		yml  string
		env  map[string]string
		want string // substring of the error
	}{
		{"unknown effect", "tools:\n  - name: t\n    effect: maybe\n    invoke: {url: \"http://h/x\"}\n",
			nil, `tool "t": effect: unknown effect class "maybe"`},
		{"missing effect", "tools:\n  - name: t\n    invoke: {url: \"http://h/x\"}\n",
			nil, `tool "t": effect: required`},
		{"compensable without compensate", "tools:\n  - name: inventory.reserve\n    effect: compensable\n    invoke: {url: \"http://h/x\"}\n",
			nil, `tool "inventory.reserve": compensate: required for a compensable tool`},
		{"compensate on an irreversible tool", "tools:\n  - name: t\n    effect: irreversible\n    invoke: {url: \"http://h/x\"}\n    compensate: {url: \"http://h/undo\"}\n",
			nil, `tool "t": compensate: only a compensable tool is compensated`},
		{"inline signing secret", head + "    signing_secret: whsec_abc\n",
			nil, `tool "t": signing_secret: secrets must not be written in the tools file; put the secret in an environment variable and name it in signing_secret_env`},
		{"inline token in an endpoint", head + "    reconcile: {url: \"http://127.0.0.1:9000/r\", token: abc}\n",
			nil, `tool "t": reconcile.token: secrets must not be written`},
		{"inline password", head + "    password: hunter2\n",
			nil, `tool "t": password: secrets must not be written`},
		{"unknown key", head + "    retries: 3\n",
			nil, `tool "t": retries: unknown key`},
		{"unknown nested key", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"http://h/x\", timeuot: 1s}\n",
			nil, `tool "t": invoke.timeuot: unknown key`},
		{"unknown retry key", head + "    retry: {attempts: 3}\n",
			nil, `tool "t": retry.attempts: unknown key`},
		{"unknown top-level key", head + "defaults: {}\n",
			nil, `defaults: unknown key`},
		{"duplicate names", head + "  - name: t\n    effect: idempotent\n    invoke: {url: \"http://127.0.0.1:9000/y\"}\n",
			nil, `tool "t": name: duplicate tool name (first defined as tool #1)`},
		{"missing name", "tools:\n  - effect: idempotent\n    invoke: {url: \"http://h/x\"}\n",
			nil, `tool #1: name: required`},
		{"missing invoke", "tools:\n  - name: t\n    effect: idempotent\n",
			nil, `tool "t": invoke: required`},
		{"template does not parse", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"http://h/x?k={{.Key\"}\n",
			nil, `tool "t": invoke.url: not a valid template`},
		{"template names an unknown field", head + "    reconcile: {url: \"http://127.0.0.1:9000/r?k={{.Keyy}}\"}\n",
			nil, `tool "t": reconcile.url: {{.Keyy}} is not a template field; the fields are .Key, .OperationKey, .DownstreamID, .Args.NAME`},
		{"template names an unknown field inside if", head + "    reconcile: {url: \"http://127.0.0.1:9000/r{{if .Args.x}}?k={{.Argz.x}}{{end}}\"}\n",
			nil, `tool "t": reconcile.url: {{.Argz.x}} is not a template field`},
		{"host not in allowed_hosts", head + "    allowed_hosts: [\"127.0.0.1:9000\"]\n    reconcile: {url: \"http://evil.example:9000/r\"}\n",
			nil, `tool "t": reconcile.url: host "evil.example:9000" is not in allowed_hosts`},
		{"templated host without allowed_hosts", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"http://{{.Args.host}}/x\"}\n",
			nil, `tool "t": invoke.url: the host comes from the template; list the hosts it may take in allowed_hosts`},
		{"not http", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"ftp://h/x\"}\n",
			nil, `tool "t": invoke.url: scheme "ftp" is not http or https`},
		{"relative url", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"/x\"}\n",
			nil, `tool "t": invoke.url: must be an absolute http or https URL`},
		{"credentials in url", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"http://u:p@h/x\"}\n",
			nil, `tool "t": invoke.url: credentials must not be written in the URL`},
		{"zero timeout", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"http://h/x\", timeout: 0s}\n",
			nil, `tool "t": invoke.timeout: must be positive, got 0s`},
		{"negative timeout", head + "    reconcile: {url: \"http://127.0.0.1:9000/r\", timeout: -1s}\n",
			nil, `tool "t": reconcile.timeout: must be positive, got -1s`},
		{"bad duration", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {url: \"http://h/x\", timeout: soon}\n",
			nil, `tool "t": invoke.timeout: not a duration: "soon"`},
		{"unsupported method", "tools:\n  - name: t\n    effect: idempotent\n    invoke: {method: TRACE, url: \"http://h/x\"}\n",
			nil, `tool "t": invoke.method: unsupported method "TRACE"`},
		{"max_attempts zero", head + "    retry: {max_attempts: 0}\n",
			nil, `tool "t": retry.max_attempts: must be at least 1`},
		{"max_delay below base_delay", head + "    retry: {base_delay: 2s, max_delay: 1s}\n",
			nil, `tool "t": retry.max_delay: 1s is below base_delay 2s`},
		{"zero deadline", head + "    retry: {deadline: 0s}\n",
			nil, `tool "t": retry.deadline: must be positive`},
		{"invalid args_schema", head + "    args_schema: {type: 5}\n",
			nil, `tool "t": args_schema: invalid JSON Schema`},
		{"args_schema with a file reference", head + "    args_schema: {$ref: \"file:///etc/passwd\"}\n",
			nil, `tool "t": args_schema: invalid JSON Schema`},
		{"args_schema not a mapping", head + "    args_schema: [1, 2]\n",
			nil, `tool "t": args_schema: invalid JSON Schema`},
		{"missing signing env var", head + "    signing_secret_env: TOOL_SECRET\n",
			nil, `tool "t": signing_secret_env: environment variable TOOL_SECRET is not set`},
		{"malformed signing secret", head + "    signing_secret_env: TOOL_SECRET\n",
			map[string]string{"TOOL_SECRET": "whsec_!!not-base64!!"}, `tool "t": signing_secret_env: environment variable TOOL_SECRET: signing secret must be whsec_ followed by base64`},
		{"secret in place of the env var name", head + "    signing_secret_env: whsec_abc/def=\n",
			nil, `tool "t": signing_secret_env: not an environment variable name`},
		{"bad idempotency header", head + "    idempotency_header: Idempotency Key\n",
			nil, `tool "t": idempotency_header: not a valid header name`},
		{"zero max_response_bytes", head + "    max_response_bytes: 0\n",
			nil, `tool "t": max_response_bytes: must be positive`},
		{"zero dedup_window", head + "    dedup_window: 0s\n",
			nil, `tool "t": dedup_window: must be positive`},
		{"dedup_window not a duration", head + "    dedup_window: a month\n",
			nil, `tool "t": dedup_window: not a duration`},
		{"empty principal", head + "    allowed_principals: [\"\"]\n",
			nil, `tool "t": allowed_principals[0]: empty principal`},
		{"wrong type", head + "    requires_approval: maybe\n",
			nil, `tool "t": malformed`},
		{"tool not a mapping", "tools:\n  - just-a-name\n",
			nil, `tool #1: must be a mapping`},
		{"no tools key", "tool: []\n",
			nil, `tool: unknown key`},
		{"not yaml", "tools: [\n",
			nil, `not valid YAML`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg, err := Parse([]byte(tt.yml), func(k string) string { return tt.env[k] })
			if err == nil {
				t.Fatalf("Parse accepted:\n%s\nnames %v", tt.yml, reg.Names())
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Parse error:\n%v\nwant it to contain:\n%s", err, tt.want)
			}
			var ce *tool.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, tool.ErrInvalidConfig) {
				t.Fatalf("error is not a *ConfigError: %#v", err)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "whsec_abc") && tt.name != "secret in place of the env var name" {
				t.Fatalf("the error echoes a secret: %v", err)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	t.Parallel()
	yml := "tools:\n  - name: a\n    effect: maybe\n    invoke: {url: \"http://h/x\", timeout: 0s}\n  - name: b\n    effect: compensable\n    invoke: {url: \"http://h/x\"}\n"
	_, err := Parse([]byte(yml), nil)
	for _, want := range []string{`tool "a": effect:`, `tool "a": invoke.timeout:`, `tool "b": compensate:`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %s", err, want)
		}
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tools.yaml")
	yml := "tools:\n  - name: inventory.reserve\n    effect: compensable\n    invoke: {url: \"http://h/x\"}\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path, nil)
	want := path + `: tool "inventory.reserve": compensate: required for a compensable tool`
	if err == nil || err.Error() != want {
		t.Fatalf("Load error = %v\nwant %s", err, want)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestParseOptionalKeys(t *testing.T) {
	t.Parallel()
	secret := testSecret(t)
	yml := `
tools:
  - name: full
    description: every optional key
    effect: idempotent
    invoke: {method: patch, url: "https://api.example.com:8443/v1/things/{{.Args.id}}", timeout: 1500ms}
    reconcile: {method: POST, url: "https://api.example.com:8443/v1/lookup"}
    idempotency_header: X-Idempotency-Key
    retry: {max_attempts: 7, base_delay: 50ms}
    requires_approval: true
    allowed_hosts: [api.example.com]
    downstream_id_field: ref
    max_response_bytes: 2048
    dedup_window: 24h
    signing_secret_env: FULL_SECRET
    args_schema:
      type: object
      properties:
        password: {type: string}
  - name: empty
    effect: irreversible
    invoke: {url: "http://10.0.0.1/x"}
    args_schema:
`
	reg, err := Parse([]byte(yml), func(k string) string {
		if k == "FULL_SECRET" {
			return secret
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	tl, _ := reg.Get("full")
	ht := tl.(*HTTPTool)
	s := ht.Spec()
	if s.Caps.MaxAttempts != 7 || s.Caps.BaseDelay != 50*time.Millisecond || s.Caps.MaxDelay != policy.DefaultMaxDelay ||
		!s.RequiresApproval || s.IdempotencyHeader != "X-Idempotency-Key" || s.Timeout != 1500*time.Millisecond ||
		s.DedupWindow != 24*time.Hour {
		t.Fatalf("spec = %+v", s)
	}
	if ht.invoke.method != "PATCH" || ht.reconcile.method != "POST" || ht.idField != "ref" || ht.maxBody != 2048 || ht.signer == nil {
		t.Fatalf("tool = %+v", ht)
	}
	if !ht.hostAllowed("api.example.com:8443", "api.example.com") || ht.hostAllowed("evil.example.com", "evil.example.com") {
		t.Fatal("allowed_hosts by hostname")
	}
	if tl, _ := reg.Get("empty"); tl.Spec().DedupWindow != 0 {
		t.Fatalf("dedup_window unset = %s, want 0 (the deployment's default)", tl.Spec().DedupWindow)
	}
	if tl, _ := reg.Get("empty"); len(tl.Spec().ArgsSchema) != 0 {
		t.Fatalf("empty args_schema = %s", tl.Spec().ArgsSchema)
	}
	if _, err := Parse([]byte("tools: []\n"), nil); err != nil {
		t.Fatalf("an empty list: %v", err)
	}
}

// TestGoToolsShareTheRegistry: Go tools and the tools file's HTTP tools
// live in one registry, and a Go tool cannot shadow a file tool.
func TestGoToolsShareTheRegistry(t *testing.T) {
	noop := func(context.Context, tool.Call) (json.RawMessage, error) { return nil, nil }
	file, err := Load("testdata/tools.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := file.Register(tool.NewGoTool(tool.Spec{Name: "local.echo", Effect: events.Idempotent}, noop)); err != nil {
		t.Fatal(err)
	}
	if err := file.Register(tool.NewGoTool(tool.Spec{Name: "payments.charge", Effect: events.Idempotent}, noop)); !errors.Is(err, tool.ErrDuplicateTool) {
		t.Fatalf("a Go tool shadowed a file tool: %v", err)
	}
}
