//go:build crashpoints

package app

import (
	"os"
	"syscall"
)

// EnvCrashPoint names the executor point (executor.Point*) or workflow
// driver point (workflow.Point*) at which a
// binary built with -tags crashpoints SIGKILLs itself. Only the crash
// tests build that binary; a default build has no such variable.
const EnvCrashPoint = "EFFECTLINE_CRASHPOINT"

// crashPoint returns the executor's and the workflow driver's crash hook
// for EFFECTLINE_CRASHPOINT:
// it SIGKILLs this process the first time the named point is reached, as a
// power cut would, with no deferred cleanup and no offset commit.
func crashPoint(getenv func(string) string) func(string) {
	point := getenv(EnvCrashPoint)
	if point == "" {
		return nil
	}
	return func(p string) {
		if p == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is asynchronous; never run past the point
		}
	}
}
