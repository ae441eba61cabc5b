package tool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectline/effectline/events"
)

var (
	// ErrInvalidArgs is wrapped by every *ArgsError: the arguments do not
	// match the tool's args_schema. Callers answer it with a client error.
	ErrInvalidArgs = errors.New("invalid args")
	// ErrForbidden is wrapped by every *ForbiddenError.
	ErrForbidden = errors.New("principal not allowed")
	// ErrInvalidConfig is wrapped by every *ConfigError.
	ErrInvalidConfig = errors.New("invalid tools file")
	// ErrDuplicateTool is returned by Registry.Register for a taken name.
	ErrDuplicateTool = errors.New("duplicate tool name")
)

// ArgsError names the argument that failed validation.
type ArgsError struct {
	Tool string
	// Field is a JSON pointer into the args ("/amount", "/items/0/sku");
	// empty for the args as a whole.
	Field  string
	Reason string
}

func (e *ArgsError) Error() string {
	field := e.Field
	if field == "" {
		field = "args"
	}
	if e.Tool != "" {
		return fmt.Sprintf("invalid args for tool %q: %s: %s", e.Tool, field, e.Reason)
	}
	return fmt.Sprintf("invalid args: %s: %s", field, e.Reason)
}

func (e *ArgsError) Unwrap() error { return ErrInvalidArgs }

// IsArgsError reports whether err is or wraps an *ArgsError.
func IsArgsError(err error) bool {
	var ae *ArgsError
	return errors.As(err, &ae)
}

// ForbiddenError says which principal may not use which tool.
type ForbiddenError struct {
	Tool      string
	Principal string
}

func (e *ForbiddenError) Error() string {
	return fmt.Sprintf("principal %q may not use tool %q", e.Principal, e.Tool)
}

func (e *ForbiddenError) Unwrap() error { return ErrForbidden }

// IsForbidden reports whether err is or wraps a *ForbiddenError.
func IsForbidden(err error) bool {
	var fe *ForbiddenError
	return errors.As(err, &fe)
}

// ConfigError is one problem in the tools file, naming the tool and the key.
type ConfigError struct {
	// File is the path the registry was loaded from, if any.
	File string
	// Tool is the tool's name, or "#n" (1-based) when it has none yet.
	Tool string
	// Key is the offending key, dotted for nested ones ("invoke.timeout").
	Key    string
	Reason string
	Err    error
}

func (e *ConfigError) Error() string {
	msg := ""
	if e.File != "" {
		msg = e.File + ": "
	}
	if e.Tool != "" {
		if e.Tool[0] == '#' {
			msg += "tool " + e.Tool + ": "
		} else {
			msg += fmt.Sprintf("tool %q: ", e.Tool)
		}
	}
	if e.Key != "" {
		msg += e.Key + ": "
	}
	msg += e.Reason
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns both the cause and ErrInvalidConfig, so errors.Is finds
// either.
func (e *ConfigError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalidConfig, e.Err}
	}
	return []error{ErrInvalidConfig}
}

// PermanentError marks a Go tool's failure as final: the effect did not
// happen and trying again will not help (a business rejection).
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// RetryableError marks a Go tool's failure as retryable: the effect did not
// happen and a later attempt may succeed. After is the earliest sensible
// retry, like an HTTP Retry-After (0 for none).
type RetryableError struct {
	Err   error
	After time.Duration
}

func (e *RetryableError) Error() string { return "retryable: " + e.Err.Error() }
func (e *RetryableError) Unwrap() error { return e.Err }

// UnknownError marks a Go tool's outcome as unknown: the effect may have
// happened (the tool lost track after sending something).
type UnknownError struct{ Err error }

func (e *UnknownError) Error() string { return "unknown outcome: " + e.Err.Error() }
func (e *UnknownError) Unwrap() error { return e.Err }

// Permanent marks err as a final failure with no effect. A nil err still
// yields an error: a tool that means "failed" must never read as success.
func Permanent(err error) error {
	return &PermanentError{Err: orGeneric(err, "permanent failure")}
}

// Retryable marks err as a failure with no effect that may be retried after
// the given delay (0 for the policy's own backoff).
func Retryable(err error, after time.Duration) error {
	return &RetryableError{Err: orGeneric(err, "retryable failure"), After: after}
}

// Unknown marks err as an outcome that may or may not have taken effect.
func Unknown(err error) error {
	return &UnknownError{Err: orGeneric(err, "unknown outcome")}
}

func orGeneric(err error, msg string) error {
	if err == nil {
		return errors.New(msg)
	}
	return err
}

// IsPermanent reports whether err carries the Permanent mark.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// IsRetryable reports whether err carries the Retryable mark.
func IsRetryable(err error) bool {
	var re *RetryableError
	return errors.As(err, &re)
}

// IsUnknown reports whether err carries the Unknown mark.
func IsUnknown(err error) bool {
	var ue *UnknownError
	return errors.As(err, &ue)
}

// FromError is the one mapping from what a Go tool returned to an outcome:
//
//   - nil → Succeeded;
//   - Permanent → Failed, final;
//   - Retryable → Failed, retryable, with its Retry-After;
//   - Unknown, a context deadline or cancellation, and every other error →
//     Unknown.
//
// An error nobody classified may have been raised after the effect (the
// payment went through, then writing the receipt failed), and a tool that
// ran out of time may have been cut off after sending: calling either
// "failed" could double the effect on retry. When several marks wrap each
// other, the outermost one wins: it is the latest decision about the error.
func FromError(err error) Result {
	if err == nil {
		return SucceededResult()
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch m := e.(type) {
		case *PermanentError:
			return FailedResult(events.Final, "permanent", err)
		case *RetryableError:
			r := FailedResult(events.Retryable, "retryable", err)
			r.RetryAfter = max(m.After, 0)
			return r
		case *UnknownError:
			return UnknownResult("unknown", err)
		}
	}
	switch {
	case IsPermanent(err): // marks behind a multi-error (errors.Join)
		return FailedResult(events.Final, "permanent", err)
	case IsRetryable(err):
		var re *RetryableError
		errors.As(err, &re)
		r := FailedResult(events.Retryable, "retryable", err)
		r.RetryAfter = max(re.After, 0)
		return r
	case IsUnknown(err):
		return UnknownResult("unknown", err)
	case errors.Is(err, context.DeadlineExceeded):
		return UnknownResult("timeout", err)
	case errors.Is(err, context.Canceled):
		return UnknownResult("canceled", err)
	}
	return UnknownResult("unclassified_error", err)
}
