package app

import "testing"

// Every process that journals events without a relay of its own wakes the
// relays of the others (outbox.Notifier; TestRelayWakeUps proves the wake):
// the deployments of deploy/kubernetes run each component alone.
func TestProcessesWithoutARelayNotify(t *testing.T) {
	for _, c := range []struct {
		names []string
		want  bool
	}{
		{[]string{API}, true},
		{[]string{Executor}, true},
		{[]string{Reconciler}, true},
		{[]string{Workflow}, true},
		{[]string{Projector}, false},
		{[]string{Relay}, false},
		{[]string{Relay, Executor, API}, false},
		{Components, false},
		{[]string{Executor, Projector}, true},
	} {
		if got := needsNotifier(c.names); got != c.want {
			t.Errorf("needsNotifier(%v) = %v, want %v", c.names, got, c.want)
		}
	}
}
