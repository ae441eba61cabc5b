package httptool

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"regexp"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// precondition is the tools file's precondition: a request like
// reconcile's, and expect on its 2xx body (tool.Expect).
type precondition struct {
	ep     endpoint
	expect *tool.Expect
}

// parsePrecondition builds a precondition from its endpoint and its expect
// as decoded from YAML.
func parsePrecondition(ep endpoint, expect any) (*precondition, error) {
	if expect == nil {
		return nil, errors.New("expect: required (a JSON Schema on the 2xx body)")
	}
	raw, err := yamlToJSON(expect)
	if err != nil {
		return nil, errors.New("expect: cannot be expressed as JSON: " + err.Error())
	}
	x, err := tool.ParseExpect(raw)
	if err != nil {
		return nil, err
	}
	return &precondition{ep: ep, expect: x}, nil
}

// Check runs the tool's precondition: its request, then expect on a 2xx
// body. A 404 or a body that does not match rejects the call; any other
// answer leaves it unchecked.
func (t *HTTPTool) Check(ctx context.Context, c tool.Call) (tool.Check, bool) {
	p := t.precondition
	if p == nil {
		return tool.Check{}, false
	}
	var body []byte
	if m := p.ep.method; m != http.MethodGet && m != http.MethodHead && m != http.MethodDelete {
		body = []byte(c.Args)
		if len(bytes.TrimSpace(body)) == 0 {
			body = []byte("{}")
		}
	}
	r := t.call(ctx, p.ep, c, body)
	url := ""
	if u, err := p.ep.url.render(c); err == nil {
		u.RawQuery = ""
		url = u.String()
	}
	chk := tool.Check{StatusCode: r.StatusCode}
	switch {
	case r.Outcome == events.Succeeded:
		reason, err := p.expect.Verify(c, r.Body)
		switch {
		case err != nil:
			chk.Verdict, chk.ErrorClass, chk.Reason = tool.Rejected, tool.ClassPreconditionFailed, err.Error()
		case reason != "":
			chk.Verdict, chk.ErrorClass, chk.Reason = tool.Rejected, tool.ClassPreconditionFailed, reason
		default:
			chk.Verdict = tool.Passed
		}
	case r.StatusCode == http.StatusNotFound:
		chk.Verdict, chk.ErrorClass = tool.Rejected, tool.ClassPreconditionFailed
		chk.Reason = "the precondition's record does not exist (404)"
	default:
		chk.Verdict, chk.ErrorClass, chk.RetryAfter = tool.Unchecked, tool.ClassPreconditionUnavailable, r.RetryAfter
		chk.Reason = "the precondition could not be checked: " + checkFailure(r)
	}
	chk.Evidence = tool.CheckEvidence("precondition", &t.spec, c, p.ep.method, url, chk, r.Body)
	return chk, true
}

// checkFailure says why a precondition could not be asked, URL queries cut.
func checkFailure(r tool.Result) string {
	if r.Err != nil {
		return queryInError.ReplaceAllString(r.Err.Error(), "?…")
	}
	return r.ErrorClass
}

// queryInError matches the query of a URL quoted in an error: a URL
// template may put args there.
var queryInError = regexp.MustCompile(`\?[^\s"']*`)
