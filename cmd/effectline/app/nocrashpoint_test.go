//go:build !crashpoints

package app

import "testing"

// TestNoCrashPointByDefault: without the crashpoints tag the executor gets
// no crash hook and the environment is not asked for one.
func TestNoCrashPointByDefault(t *testing.T) {
	hook := crashPoint(func(name string) string {
		t.Errorf("the default build read %s", name)
		return "before_call"
	})
	if hook != nil {
		t.Error("the default build has a crash hook")
	}
}
