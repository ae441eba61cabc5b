package ui

// Internals the external tests (package ui_test) use.
var (
	CSRFToken     = csrfToken
	OperationHref = uiOperationHref
	WorkflowHref  = uiWorkflowHref
	SessionValue  = sessionValue
	CSSURL        = uiCSSURL
)

const (
	SessionCookie = uiSessionCookie
	FormMaxBytes  = uiFormMaxBytes
)
