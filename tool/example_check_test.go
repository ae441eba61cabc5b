package tool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// A check hook holds the rules a schema cannot express. The executor runs it
// before every attempt with the principal and the args: an error rejects the
// call for good and nothing is sent; tool.Retryable means the rule could not
// be checked, and the attempt is tried again within the caps.
func ExampleWithCheck() {
	owners := map[string]string{"o-1": "shop-agent"}
	refund := tool.NewGoTool(tool.Spec{Name: "payments.refund", Effect: events.Irreversible},
		func(ctx context.Context, c tool.Call) (json.RawMessage, error) {
			return json.RawMessage(`{"id":"re_1"}`), nil
		},
		tool.WithCheck(func(ctx context.Context, principal string, args json.RawMessage) error {
			var a struct {
				OrderID string `json:"order_id"`
			}
			if err := json.Unmarshal(args, &a); err != nil {
				return err
			}
			if owners[a.OrderID] != principal {
				return errors.New("the order belongs to another customer")
			}
			return nil
		}))
	for _, who := range []string{"shop-agent", "other-agent"} {
		chk, _ := refund.Check(context.Background(), tool.Call{Principal: who, Args: json.RawMessage(`{"order_id":"o-1"}`)})
		fmt.Printf("%s: %s class=%q reason=%q\n", who, chk.Verdict, chk.ErrorClass, chk.Reason)
	}
	// Output:
	// shop-agent: passed class="" reason=""
	// other-agent: rejected class="check_rejected" reason="the order belongs to another customer"
}
