package policy

import (
	"time"

	"github.com/effectline/effectline/events"
)

// AfterFailure decides what follows a confirmed failure (no effect): a final
// failure stops; a retryable one is retried within the caps. The effect class
// does not matter here: nothing happened, so even an irreversible effect may
// go out again (contract §2, row "Failed, retryable").
//
// It returns the due time of the next attempt, or nil when none follows (the
// operation ends failed). An unrecognised kind is treated as final: stopping
// is the choice that cannot double an effect.
func AfterFailure(kind events.FailureKind, caps Caps, attempt int, first, now time.Time, retryAfter time.Duration, rnd func() float64) (retryAt *time.Time) {
	if kind != events.Retryable {
		return nil
	}
	at, ok := caps.NextRetry(attempt, first, now, retryAfter, rnd)
	if !ok {
		return nil
	}
	return &at
}

// AfterUnknown decides what follows an attempt whose outcome is unknown
// (contract §2, rows "Unknown" and "caps exhausted on Unknown"):
//
//   - idempotent: retry with the same downstream key within the caps
//     (NextRetry and its due time); once the caps are spent, NextReconcile,
//     which leaves the operation needs_reconciliation.
//   - compensable: NextCompensate while a retry can still follow: the undo
//     turns "unknown" back into "nothing happened" before the retry under a
//     new key (its due time is decided after the undo, by AfterCompensation).
//     Once the caps are spent no retry follows, so undoing an attempt that
//     may well have succeeded would only throw the effect away: NextReconcile
//     instead (contract §2, "caps exhausted on Unknown"), and the reconciler
//     asks whether the last attempt stands.
//   - irreversible: NextReconcile, always: it is never retried blindly.
//
// An invalid class is treated as irreversible: asking the downstream is the
// one move that is safe for every effect.
func AfterUnknown(class events.EffectClass, caps Caps, attempt int, first, now time.Time, retryAfter time.Duration, rnd func() float64) (next events.Next, retryAt *time.Time) {
	switch class {
	case events.Idempotent:
		at, ok := caps.NextRetry(attempt, first, now, retryAfter, rnd)
		if !ok {
			return events.NextReconcile, nil
		}
		return events.NextRetry, &at
	case events.Compensable:
		if _, ok := caps.NextRetry(attempt, first, now, retryAfter, rnd); !ok {
			return events.NextReconcile, nil
		}
		return events.NextCompensate, nil
	default:
		return events.NextReconcile, nil
	}
}

// AfterCompensation decides, once the undo of attempt has succeeded, when the
// retry under a new downstream key is due, or nil when the caps are spent; the
// operation then ends compensated: the effect is known not to stand.
func AfterCompensation(caps Caps, attempt int, first, now time.Time, rnd func() float64) *time.Time {
	at, ok := caps.NextRetry(attempt, first, now, 0, rnd)
	if !ok {
		return nil
	}
	return &at
}
