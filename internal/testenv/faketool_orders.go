package testenv

import (
	"net/http"
	"path"
	"strings"
)

// RouteOrder is GET /orders/<id>: the downstream's record of an order, the
// kind of record a tool's precondition reads before a refund or a charge.
// Its state is what a test sets with [FakeTool.SetOrder]; an order never set
// (or deleted) answers 404. Faults are scripted on it like on any route.
const RouteOrder = "order"

// SetOrder sets (or replaces) the record GET /orders/<id> answers, so a test
// can make a record stale between an intent and its attempt: refunded,
// moved to another owner, its total lowered.
func (ft *FakeTool) SetOrder(id string, record map[string]any) {
	b := mustJSON(record)
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if ft.orders == nil {
		ft.orders = map[string][]byte{}
	}
	ft.orders[id] = b
}

// DeleteOrder removes an order: its record answers 404.
func (ft *FakeTool) DeleteOrder(id string) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	delete(ft.orders, id)
}

// orderID returns the id of an order path, or false.
func orderID(r *http.Request) (string, bool) {
	p := path.Clean("/" + r.URL.Path)
	id, ok := strings.CutPrefix(p, "/orders/")
	if !ok || id == "" || strings.Contains(id, "/") || r.Method != http.MethodGet {
		return "", false
	}
	return id, true
}

func (ft *FakeTool) order(id string) (int, []byte) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if b, ok := ft.orders[id]; ok {
		return http.StatusOK, b
	}
	return http.StatusNotFound, mustJSON(map[string]string{"error": "not_found"})
}

// Unscript drops the faults still queued for route and returns how many
// there were, so a test can stop a scripted outage at the moment it chooses.
func (ft *FakeTool) Unscript(route string) int {
	mustRoute(route)
	ft.mu.Lock()
	defer ft.mu.Unlock()
	n := len(ft.scripts[route])
	delete(ft.scripts, route)
	return n
}
