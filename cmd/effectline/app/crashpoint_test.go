//go:build crashpoints

package app

import "testing"

// TestCrashPointTagged: a crashpoints build arms the hook from the
// environment, and only when the variable is set.
func TestCrashPointTagged(t *testing.T) {
	if crashPoint(func(string) string { return "" }) != nil {
		t.Error("a hook without EFFECTLINE_CRASHPOINT")
	}
	if crashPoint(func(k string) string { return map[string]string{EnvCrashPoint: "before_call"}[k] }) == nil {
		t.Error("no hook with EFFECTLINE_CRASHPOINT set")
	}
}
