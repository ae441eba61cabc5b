package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effectline/effectline/internal/testenv"
)

// bearer adds the agent's token to every request of the MCP client.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func mcpText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*sdk.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

func mcpState(t *testing.T, res *sdk.CallToolResult) map[string]any {
	t.Helper()
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return m
}

// The SDK's own client, over streamable HTTP, against the API process of a
// three-process deployment: list, call once, call again, call without a
// key, and an unknown outcome.
func TestAgentMCP(t *testing.T) {
	t.Parallel()
	aw := newAgentWorld(t)
	ctx := untilCtx(t, 3*time.Minute)
	client := sdk.NewClient(&sdk.Implementation{Name: "effectline-test", Version: "1"}, nil)
	session, err := client.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint: aw.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{agentToken}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	defer session.Close()

	list, err := session.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*sdk.Tool{}
	for _, tl := range list.Tools {
		byName[tl.Name] = tl
	}
	for name, idempotent := range map[string]bool{"cache.set": true, "inventory.reserve": false, "payments.charge": false} {
		tl := byName[name]
		if tl == nil || tl.Annotations == nil {
			t.Fatalf("tools/list lacks %s: %+v", name, list.Tools)
		}
		a := tl.Annotations
		if a.IdempotentHint != idempotent || a.DestructiveHint == nil || *a.DestructiveHint == idempotent || a.ReadOnlyHint {
			t.Errorf("%s annotations = %+v", name, a)
		}
	}
	schema, _ := json.Marshal(byName["payments.charge"].InputSchema)
	if !strings.Contains(string(schema), `"card_number"`) || !strings.Contains(string(schema), `"type":"object"`) {
		t.Errorf("payments.charge inputSchema = %s", schema)
	}

	call := func(name string, meta sdk.Meta) *sdk.CallToolResult {
		t.Helper()
		res, err := session.CallTool(ctx, &sdk.CallToolParams{Meta: meta, Name: name, Arguments: map[string]any{"amount": 1200}})
		if err != nil {
			t.Fatalf("tools/call %s: %v", name, err)
		}
		return res
	}

	// A call runs once and waits for its outcome.
	meta := sdk.Meta{"effectline/operation_key": "mcp-1/cache", "effectline/wait_seconds": 30}
	res := call("cache.set", meta)
	if res.IsError || mcpState(t, res)["state"] != "succeeded" || mcpState(t, res)["operation_key"] != "mcp-1/cache" ||
		!strings.HasPrefix(mcpText(res), "succeeded:") {
		t.Fatalf("first call: error=%t %v %q", res.IsError, mcpState(t, res), mcpText(res))
	}
	if n := aw.fake.EffectsForKey("mcp-1/cache"); n != 1 {
		t.Errorf("the call took effect %d times", n)
	}

	// The same call again answers the stored outcome and executes nothing.
	before := aw.fake.Requests(testenv.RouteInvoke)
	again := call("cache.set", meta)
	if again.IsError || mcpState(t, again)["state"] != "succeeded" {
		t.Errorf("second call: error=%t %v", again.IsError, mcpState(t, again))
	}

	// Without a key the call is refused and nothing is journaled.
	refused := call("cache.set", nil)
	if !refused.IsError || !strings.Contains(mcpText(refused), "no operation key") {
		t.Errorf("call without a key: error=%t %q", refused.IsError, mcpText(refused))
	}
	if after := aw.fake.Requests(testenv.RouteInvoke); after != before {
		t.Errorf("the repeat or the keyless call reached the downstream (%d → %d)", before, after)
	}
	var ops int
	if err := testenv.NewPool(t, aw.db).QueryRow(ctx, `SELECT count(DISTINCT operation_key) FROM events`).Scan(&ops); err != nil {
		t.Fatal(err)
	}
	if ops != 1 {
		t.Errorf("%d operations journaled, want the one keyed call", ops)
	}

	// An unknown outcome, keyed by workflow and step: an error result that
	// tells the model not to retry.
	aw.fake.Script(testenv.RouteInvoke, testenv.FaultLoseResponse)
	unknown := call("payments.charge", sdk.Meta{"effectline/workflow_id": "ord-9", "effectline/step": "charge", "effectline/wait_seconds": 30})
	st := mcpState(t, unknown)
	if !unknown.IsError || st["state"] != "unknown" || st["operation_key"] != "wf:ord-9/charge" ||
		!strings.Contains(mcpText(unknown), "do not retry") {
		t.Errorf("unknown outcome: error=%t %v %q", unknown.IsError, st, mcpText(unknown))
	}
}
