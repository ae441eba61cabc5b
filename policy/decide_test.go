package policy

import (
	"testing"
	"time"

	"github.com/effectline/effectline/events"
)

// The tests below walk every cell of contract §2's table, per effect class:
//
//	outcome                    | idempotent        | compensable                 | irreversible
//	Failed, final              | stop              | stop                        | stop
//	Failed, retryable          | retry within caps | retry within caps           | retry within caps
//	Unknown                    | retry within caps | undo, then retry (new key)  | reconcile
//	caps exhausted on Unknown  | needs_recon.      | undo, then end compensated  | —  (reconcile)
//	caps exhausted on Failed   | stop              | stop                        | stop

var (
	testCaps  = Caps{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: 4 * time.Second, Deadline: time.Minute}
	testFirst = time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
	testNow   = testFirst.Add(2 * time.Second)
	half      = func() float64 { return 0.5 }
)

func TestAfterFailure(t *testing.T) {
	t.Parallel()
	for _, class := range events.EffectClasses() {
		tests := []struct {
			name       string
			kind       events.FailureKind
			attempt    int
			now        time.Time
			retryAfter time.Duration
			want       *time.Time
		}{
			{"final stops", events.Final, 1, testNow, 0, nil},
			{"final stops even with attempts left and retry-after", events.Final, 1, testNow, time.Second, nil},
			{"retryable retries within caps", events.Retryable, 1, testNow, 0, ptr(testNow.Add(500 * time.Millisecond))},
			{"retryable honors retry-after", events.Retryable, 2, testNow, 3 * time.Second, ptr(testNow.Add(3 * time.Second))},
			{"retryable with retry-after above max delay stops", events.Retryable, 1, testNow, 5 * time.Second, nil},
			{"retryable with attempts spent stops", events.Retryable, 3, testNow, 0, nil},
			{"retryable past the deadline stops", events.Retryable, 1, testFirst.Add(time.Minute), 0, nil},
			{"unrecognised kind stops", events.FailureKind("maybe"), 1, testNow, 0, nil},
		}
		for _, tt := range tests {
			t.Run(string(class)+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				got := AfterFailure(tt.kind, testCaps, tt.attempt, testFirst, tt.now, tt.retryAfter, half)
				if !sameTime(got, tt.want) {
					t.Fatalf("AfterFailure = %v, want %v", fmtPtr(got), fmtPtr(tt.want))
				}
			})
		}
	}
}

func TestAfterUnknown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		class      events.EffectClass
		attempt    int
		now        time.Time
		retryAfter time.Duration
		next       events.Next
		retryAt    *time.Time
	}{
		{"idempotent retries within caps", events.Idempotent, 1, testNow, 0, events.NextRetry, ptr(testNow.Add(500 * time.Millisecond))},
		{"idempotent backoff doubles", events.Idempotent, 2, testNow, 0, events.NextRetry, ptr(testNow.Add(time.Second))},
		{"idempotent honors retry-after", events.Idempotent, 1, testNow, 2 * time.Second, events.NextRetry, ptr(testNow.Add(2 * time.Second))},
		{"idempotent attempts spent → reconcile", events.Idempotent, 3, testNow, 0, events.NextReconcile, nil},
		{"idempotent past deadline → reconcile", events.Idempotent, 1, testFirst.Add(time.Minute), 0, events.NextReconcile, nil},
		{"idempotent retry-after beyond caps → reconcile", events.Idempotent, 1, testNow, time.Hour, events.NextReconcile, nil},
		{"compensable undoes first", events.Compensable, 1, testNow, 0, events.NextCompensate, nil},
		{"compensable reconciles when no retry can follow", events.Compensable, 3, testFirst.Add(time.Hour), 0, events.NextReconcile, nil},
		{"compensable reconciles after the last attempt", events.Compensable, 4, testNow, 0, events.NextReconcile, nil},
		{"irreversible reconciles", events.Irreversible, 1, testNow, 0, events.NextReconcile, nil},
		{"irreversible reconciles despite retry-after", events.Irreversible, 1, testNow, time.Second, events.NextReconcile, nil},
		{"irreversible with caps spent reconciles", events.Irreversible, 3, testNow, 0, events.NextReconcile, nil},
		{"unknown class reconciles", events.EffectClass("bogus"), 1, testNow, 0, events.NextReconcile, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			next, at := AfterUnknown(tt.class, testCaps, tt.attempt, testFirst, tt.now, tt.retryAfter, half)
			if next != tt.next || !sameTime(at, tt.retryAt) {
				t.Fatalf("AfterUnknown = (%s, %v), want (%s, %v)", next, fmtPtr(at), tt.next, fmtPtr(tt.retryAt))
			}
		})
	}
}

func TestAfterCompensation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		attempt int
		now     time.Time
		want    *time.Time
	}{
		{"retry under a new key within caps", 1, testNow, ptr(testNow.Add(500 * time.Millisecond))},
		{"second undo backs off further", 2, testNow, ptr(testNow.Add(time.Second))},
		{"attempts spent: ends compensated", 3, testNow, nil},
		{"deadline passed: ends compensated", 1, testFirst.Add(time.Minute), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := AfterCompensation(testCaps, tt.attempt, testFirst, tt.now, half)
			if !sameTime(got, tt.want) {
				t.Fatalf("AfterCompensation = %v, want %v", fmtPtr(got), fmtPtr(tt.want))
			}
		})
	}
}

// A zero Caps behaves like the defaults, so a tool registered without a
// retry block still retries within contract §6's example caps.
func TestZeroCapsUseDefaults(t *testing.T) {
	t.Parallel()
	next, at := AfterUnknown(events.Idempotent, Caps{}, 3, testFirst, testNow, 0, half)
	if next != events.NextRetry || at == nil {
		t.Fatalf("attempt 3 of 4 with default caps: (%s, %v)", next, fmtPtr(at))
	}
	next, at = AfterUnknown(events.Idempotent, Caps{}, 4, testFirst, testNow, 0, half)
	if next != events.NextReconcile || at != nil {
		t.Fatalf("attempt 4 of 4 with default caps: (%s, %v)", next, fmtPtr(at))
	}
}

func ptr(t time.Time) *time.Time { return &t }

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

func fmtPtr(t *time.Time) string {
	if t == nil {
		return "<nil>"
	}
	return t.Format(time.RFC3339Nano)
}
