package api

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effectline/effectline/api/mcp"
	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/workflow"
)

// bearerTransport adds a token to every request of the MCP client.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

const undoToolsFile = toolsFile + `workflows:
  - name: order
    steps:
      - {name: reserve, tool: inventory.reserve, args: {sku: "x"}}
      - {name: charge, tool: payments.charge, args: {amount: 1, currency: EUR}}
`

// The undo tools a workflow generates (inventory.reserve~undo) are
// registered, so the executor runs them, but a model is never offered one:
// tools/list leaves them out, even from a catalogue given by hand, and
// tools/call does not know them.
func TestMCPDoesNotOfferUndoTools(t *testing.T) {
	t.Parallel()
	reg, err := httptool.Parse([]byte(undoToolsFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := workflow.Parse([]byte(undoToolsFile), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := workflow.RegisterUndoTools(reg, defs); err != nil {
		t.Fatal(err)
	}
	undo := workflow.UndoToolName("inventory.reserve")
	if u, ok := reg.Get(undo); !ok || !u.Spec().Internal {
		t.Fatalf("%s is not registered as an internal tool", undo)
	}
	catalogue := RegistryCatalogue(reg)
	for _, c := range catalogue {
		if c.Name == undo {
			t.Fatalf("RegistryCatalogue lists %s", undo)
		}
	}
	// A catalogue given by hand that names the undo tool anyway.
	byHand := append(slices.Clone(catalogue), mcp.Tool{Name: undo, Effect: "idempotent"})
	f := setup(t, func(_ *Config, d *Deps) { d.Tools, d.Catalogue = reg, byHand })

	ctx := t.Context()
	client := sdk.NewClient(&sdk.Implementation{Name: "effectline-test", Version: "1"}, nil)
	session, err := client.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint: f.url + "/mcp", HTTPClient: &http.Client{Transport: bearerTransport{opsToken}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	defer session.Close()
	list, err := session.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
	}
	if slices.Contains(names, undo) || !slices.Contains(names, "inventory.reserve") {
		t.Errorf("tools/list = %v; want inventory.reserve and not %s", names, undo)
	}
	res, err := session.CallTool(ctx, &sdk.CallToolParams{Name: undo, Meta: sdk.Meta{"effectline/operation_key": "by-a-model"},
		Arguments: map[string]any{"operation_key": "wf:o/reserve", "downstream_key": "wf:o/reserve"}})
	if err == nil && (res == nil || !res.IsError) {
		t.Errorf("tools/call of %s was accepted: %+v", undo, res)
	} else if err != nil && !strings.Contains(err.Error(), "unknown tool") {
		t.Logf("tools/call of %s refused: %v", undo, err)
	}
	if _, err := f.store.Load(context.WithoutCancel(ctx), "by-a-model"); err == nil {
		t.Errorf("tools/call of %s recorded an operation", undo)
	}
}
