package workflow_test

import (
	"strings"
	"testing"

	"github.com/effectline/effectline/tool/httptool"
	"github.com/effectline/effectline/workflow"
)

const specTools = `tools:
  - name: inventory.reserve
    effect: compensable
    invoke: {url: "http://127.0.0.1:9/r"}
    compensate: {url: "http://127.0.0.1:9/release"}
    args_schema:
      type: object
      required: [sku, quantity]
      additionalProperties: false
      properties: {sku: {type: string}, quantity: {type: integer, minimum: 1}}
  - name: payments.charge
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/c"}
    args_schema:
      type: object
      required: [amount, currency]
      properties: {amount: {type: integer}, currency: {enum: [EUR, USD]}, reservation: {type: string}}
  - name: email.send
    effect: irreversible
    invoke: {url: "http://127.0.0.1:9/e"}
`

func parse(t *testing.T, workflows string) (*workflow.Set, error) {
	t.Helper()
	file := specTools + workflows
	reg, err := httptool.Parse([]byte(file), nil)
	if err != nil {
		t.Fatalf("the tools file with workflows must load: %v", err)
	}
	return workflow.Parse([]byte(file), reg)
}

func TestParseOrder(t *testing.T) {
	t.Parallel()
	set, err := parse(t, `workflows:
  - name: order.checkout
    input_schema: {type: object, required: [sku, amount]}
    steps:
      - {name: reserve, tool: inventory.reserve, args: {sku: "{{.Input.sku}}", quantity: 1}}
      - {name: charge, tool: payments.charge, args: {amount: "{{.Input.amount}}", currency: EUR, reservation: "{{.Steps.reserve.DownstreamID}}"}}
      - {name: confirm, tool: email.send, args: {text: "order {{.Input.order_id}}"}}
`)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := set.Get("order.checkout")
	if !ok || len(d.Steps) != 3 || d.Pivot != 1 {
		t.Fatalf("order.checkout = %+v", d)
	}
}

func TestParseRefusesWithWorkflowAndStep(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, steps, want string }{
		{"unknown tool", `- {name: a, tool: nope, args: {}}`, `workflow w, step a: tool: unknown tool "nope"`},
		{"forward reference", `- {name: a, tool: payments.charge, args: {amount: "{{.Steps.b.Result.n}}", currency: EUR}}
      - {name: b, tool: email.send}`, `workflow w, step a: args: /amount: reference to step "b", which is not an earlier step`},
		{"unknown reference", `- {name: a, tool: email.send, args: {x: "{{.Foo}}"}}`, `workflow w, step a: args: /x: unknown reference .Foo`},
		{"required missing", `- {name: a, tool: payments.charge, args: {amount: 1}}`, `workflow w, step a: args: payments.charge requires "currency"`},
		{"constant refused", `- {name: a, tool: payments.charge, args: {amount: 1, currency: GBP}}`, `workflow w, step a: args: `},
		{"property not allowed", `- {name: a, tool: inventory.reserve, args: {sku: x, quantity: 1, color: red}}`, `inventory.reserve does not accept "color"`},
		{"unknown undo_with", `- {name: a, tool: payments.charge, args: {amount: 1, currency: EUR}, undo_with: payments.refund}`, `workflow w, step a: undo_with: unknown tool "payments.refund"`},
		{"unknown key", `- {name: a, tool: email.send, undo_wiht: x}`, `workflow w, step a: undo_wiht: unknown key`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(t, "workflows:\n  - name: w\n    steps:\n      "+c.steps+"\n")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error = %v; want one containing %q", err, c.want)
			}
		})
	}
}
