package tool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// A Go tool says what its errors mean with Permanent, Retryable and Unknown;
// anything it leaves unmarked is Unknown, because it may have struck after
// the effect.
func ExampleNewGoTool() {
	send := tool.NewGoTool(tool.Spec{Name: "email.send", Effect: events.Irreversible},
		func(ctx context.Context, c tool.Call) (json.RawMessage, error) {
			var args struct{ To string }
			if err := json.Unmarshal(c.Args, &args); err != nil || args.To == "" {
				return nil, tool.Permanent(errors.New("no recipient"))
			}
			if args.To == "bounce@example.com" {
				return nil, errors.New("SMTP connection dropped after DATA")
			}
			return json.RawMessage(`{"id":"msg_1"}`), nil
		})
	reg := tool.NewRegistry()
	if err := reg.Register(send); err != nil {
		panic(err)
	}
	for _, to := range []string{"ada@example.com", "", "bounce@example.com"} {
		r := send.Invoke(context.Background(), tool.Call{DownstreamKey: "op-1", Args: json.RawMessage(`{"to":"` + to + `"}`)})
		fmt.Printf("outcome=%s kind=%q class=%q id=%q\n", r.Outcome, r.Kind, r.ErrorClass, r.DownstreamID)
	}
	// Output:
	// outcome=succeeded kind="" class="" id="msg_1"
	// outcome=failed kind="final" class="permanent" id=""
	// outcome=unknown kind="" class="unclassified_error" id=""
}
