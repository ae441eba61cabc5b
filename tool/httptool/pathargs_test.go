package httptool

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/effectline/effectline/tool"
)

// TestPathArgsRefused: an arg printed into a URL path as a segment of its
// own may not be "", "." or "..", whichever request (invoke, compensate,
// reconcile) prints it; in the query it may.
func TestPathArgsRefused(t *testing.T) {
	t.Parallel()
	reg, err := Parse([]byte(`
tools:
  - name: orders.cancel
    effect: compensable
    invoke: {method: POST, url: "http://127.0.0.1:9/orders/{{.Args.order}}/cancel?note={{.Args.note}}"}
    compensate: {method: POST, url: "http://127.0.0.1:9/shops/{{.Args.shop}}/orders/{{.Args.order}}/restore"}
    reconcile: {method: GET, url: "http://127.0.0.1:9/orders/{{.Args.order | pathescape}}/status"}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	tl, _ := reg.Get("orders.cancel")
	for _, c := range []struct {
		args  string
		field string
	}{
		{`{"order": "o-1", "note": "..", "shop": "s1"}`, ""},
		{`{"order": "o.1", "note": "", "shop": "..."}`, ""},
		{`{"order": 7}`, ""},
		{`{"order": ".."}`, "/order"},
		{`{"order": "."}`, "/order"},
		{`{"order": ""}`, "/order"},
		{`{"order": "o-1", "shop": ".."}`, "/shop"},
	} {
		err := tl.Spec().ValidateArgs(json.RawMessage(c.args))
		var ae *tool.ArgsError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%s: ValidateArgs = %v, want ok", c.args, err)
		case c.field != "" && (!errors.As(err, &ae) || ae.Field != c.field):
			t.Errorf("%s: ValidateArgs = %v, want an ArgsError on %s", c.args, err, c.field)
		}
	}
}
