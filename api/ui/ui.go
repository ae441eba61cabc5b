package ui

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
	"github.com/effectline/effectline/tool"
)

//go:embed templates/*.html static/*
var uiFiles embed.FS

var (
	uiStatic = mustSub(uiFiles, "static")
	// uiCSSURL carries a digest of the stylesheet, so a new release's
	// styles are fetched at once while the old ones may be cached.
	uiCSSURL = "/ui/static/style.css?v=" + fileDigest(uiStatic, "style.css")

	uiQueuePage     = parseUIPage("queue.html")
	uiOperationPage = parseUIPage("operation.html")
	uiLoginPage     = parseUIPage("login.html")
	uiMessagePage   = parseUIPage("message.html")
)

// The templates and the stylesheet are compiled into the binary, so a
// failure here is a build mistake, found by any test: panicking at start
// is a wiring mistake at start, the one case where a panic is right.
func parseUIPage(name string) *template.Template {
	return template.Must(template.New(name).ParseFS(uiFiles, "templates/layout.html", "templates/"+name))
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

func fileDigest(fsys fs.FS, name string) string {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

const (
	// uiQueueLimit is how many operations of each waiting status the queue
	// shows. A queue longer than that is an incident; the page says so.
	uiQueueLimit = 200
	// uiMaxJSONBytes bounds one JSON value shown on a page; the JSON API
	// has the whole of it.
	uiMaxJSONBytes = 32 << 10
)

// Route is one route of the UI: a net/http.ServeMux pattern with its
// method, and its handler.
type Route struct {
	Pattern string
	Handler http.HandlerFunc
}

// Routes returns the UI's routes, for the server that mounts it. They must
// be mounted public to the bearer-token guard: the UI authenticates with its
// own cookie session (session.go).
func (s *UI) Routes() []Route {
	// "GET /ui/" matches every GET under /ui/ no other pattern takes: the
	// handler serves the queue at /ui/ itself and a 404 page elsewhere.
	return []Route{
		{"GET /ui/", s.uiQueue},
		{"GET /ui/operations/{key}", s.uiOperation},
		{"POST /ui/operations/{key}/decisions", s.uiDecide},
		{"GET /ui/workflows/{id}", s.uiWorkflow},
		{"POST /ui/workflows/{id}/decisions", s.uiWorkflowDecide},
		{"GET /ui/login", s.uiLoginForm},
		{"POST /ui/login", s.uiLogin},
		{"POST /ui/logout", s.uiLogout},
		{"GET /ui/static/{name}", s.uiStaticFile},
	}
}

// uiPage is what every page's layout renders; Data is the page's own.
type uiPage struct {
	Title        string
	Session      uiSession
	Open         bool
	DevPrincipal string
	Flash        *uiFlash
	CSS          string
	Data         any
}

// render executes a page into memory first, so a template failure is a
// clean 500 rather than half a page.
func (s *UI) render(w http.ResponseWriter, r *http.Request, status int, t *template.Template, p uiPage) {
	p.Open, p.DevPrincipal, p.CSS = s.cfg.Open, s.cfg.DevPrincipal, uiCSSURL
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		s.log.ErrorContext(r.Context(), "rendering a ui page failed", slog.String("page", t.Name()), slog.Any("error", err))
		uiSecurityHeaders(w)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	uiSecurityHeaders(w)
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	// Pages show operations and tool results: no cache may keep them.
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type uiMessage struct {
	Heading string
	Text    string
}

func (s *UI) renderMessage(w http.ResponseWriter, r *http.Request, status int, sess uiSession, heading, text string) {
	s.render(w, r, status, uiMessagePage, uiPage{Title: heading, Session: sess,
		Data: uiMessage{Heading: heading, Text: text}})
}

// redirect answers a 303 to target (a path of this UI), with the UI's
// headers.
func redirect(w http.ResponseWriter, r *http.Request, target string) {
	uiSecurityHeaders(w)
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// viewer returns the session of a page view, or sends the browser to the
// sign-in page and returns false.
func (s *UI) viewer(w http.ResponseWriter, r *http.Request) (uiSession, bool) {
	sess, ok := s.session(w, r, true)
	if !ok {
		redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()))
		return uiSession{}, false
	}
	s.server.SetSpanPrincipal(r.Context(), sess.Principal)
	return sess, true
}

// parseUIForm reads a form post's body within uiFormMaxBytes, answering the
// request itself when it cannot.
func (s *UI) parseUIForm(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, uiFormMaxBytes)
	if err := r.ParseForm(); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.renderMessage(w, r, http.StatusRequestEntityTooLarge, uiSession{}, "Too large", "The form was larger than this page ever sends.")
			return false
		}
		s.renderMessage(w, r, http.StatusBadRequest, uiSession{}, "Bad request", "The form could not be read.")
		return false
	}
	return true
}

// formPoster returns the session of a form post that passed the cross-origin
// and CSRF checks, or answers the request and returns false.
func (s *UI) formPoster(w http.ResponseWriter, r *http.Request) (uiSession, bool) {
	if err := uiCrossOrigin.Check(r); err != nil {
		s.renderMessage(w, r, http.StatusForbidden, uiSession{}, "Refused", "The form was sent from another site.")
		return uiSession{}, false
	}
	if !s.parseUIForm(w, r) {
		return uiSession{}, false
	}
	sess, ok := s.session(w, r, false)
	if !ok {
		redirect(w, r, "/ui/login")
		return uiSession{}, false
	}
	s.server.SetSpanPrincipal(r.Context(), sess.Principal)
	if !sess.checkCSRF(r) {
		s.renderMessage(w, r, http.StatusForbidden, sess, "Refused",
			"The form has expired or did not come from this server's page. Go back, reload the page and try again.")
		return uiSession{}, false
	}
	return sess, true
}

// uiItem is one operation of the queue.
type uiItem struct {
	Key, Href, Tool, EffectClass, Status string
	Attempt                              int
	Since                                string
	Reason, ReasonText, Proposed         string
	GateWhy                              string
	// Workflow and WorkflowHref name the run a step's operation belongs to.
	Workflow, WorkflowHref string
	Decide                 *uiDecideForm
	updated                time.Time
}

type uiQueueView struct {
	Items     []uiItem
	Truncated bool
	// Workflows are the runs escalated to an approver.
	Workflows          []uiWorkflowItem
	WorkflowsTruncated bool
}

// uiDecideForm is the decision form of one operation.
type uiDecideForm struct {
	URL     string
	CSRF    string
	Buttons []uiButton
	// CheckFirst: the proposal is to check the downstream, and a retry
	// needs a note and a confirmation (see guardForm).
	CheckFirst bool
}

type uiButton struct {
	Action   events.Action
	Label    string
	Proposed bool
	Disabled bool
	Why      string
}

// uiQueue lists the operations waiting for a decision from the read model:
// both waiting statuses, longest waiting first. The read model may lag the
// event store by a moment, so an operation decided a moment ago can still
// be listed; its own page (read from the event store) and the Decider's
// refusal say so.
func (s *UI) uiQueue(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.viewer(w, r)
	if !ok {
		return
	}
	if r.URL.Path != "/ui/" {
		s.renderMessage(w, r, http.StatusNotFound, sess, "Not found", "There is no page here.")
		return
	}
	ctx := r.Context()
	var q uiQueueView
	scope, ok := s.server.ListScope(sess.Principal, sess.Approver)
	for _, st := range []events.Status{events.StatusEscalated, events.StatusNeedsReconciliation} {
		if !ok {
			break
		}
		page, err := s.operations.List(ctx, events.ListFilter{Status: st, Principal: scope, Limit: uiQueueLimit})
		if err != nil {
			s.uiFailure(w, r, sess, "listing the operations waiting for a decision", "", err)
			return
		}
		q.Truncated = q.Truncated || page.NextCursor != ""
		for _, op := range page.Items {
			q.Items = append(q.Items, s.queueItem(op, sess))
		}
	}
	slices.SortStableFunc(q.Items, func(a, b uiItem) int { return a.updated.Compare(b.updated) })
	var err error
	if q.Workflows, q.WorkflowsTruncated, err = s.waitingWorkflows(r, sess); err != nil {
		s.uiFailure(w, r, sess, "listing the workflows waiting for a decision", "", err)
		return
	}
	s.render(w, r, http.StatusOK, uiQueuePage, uiPage{Title: "Waiting for a decision", Session: sess,
		Flash: takeFlash(w, r), Data: q})
}

func (s *UI) queueItem(op events.Operation, sess uiSession) uiItem {
	it := uiItem{
		Key: op.Key, Href: uiOperationHref(op.Key), Tool: op.Tool, EffectClass: string(op.EffectClass),
		Status: string(op.Status), Attempt: op.Attempt, Since: since(op.UpdatedAt), updated: op.UpdatedAt,
	}
	if id, ok := events.StepWorkflowID(op.Key); ok && s.workflows != nil {
		it.Workflow, it.WorkflowHref = id, uiWorkflowHref(id)
	}
	var proposed events.Action
	if e := op.Escalation; e != nil {
		it.Reason, it.ReasonText, it.Proposed = e.Reason, reasonText(e.Reason), string(e.ProposedAction)
		proposed = e.ProposedAction
	} else {
		it.ReasonText = reasonText("")
	}
	if op.Status.AwaitingDecision() {
		it.Decide = decideForm(op, proposed, sess)
		guardForm(it.Decide, op)
	}
	it.GateWhy, _ = gateText(op)
	return it
}

// uiOperationView is an operation's page. Args and the escalation's request
// are redacted by the tool; JSON values are pretty-printed strings.
type uiOperationView struct {
	Key, Tool, EffectClass, Status, Phase, Principal string
	DownstreamKey, DownstreamID, LastErrorClass      string
	Attempt                                          int
	Created, Updated                                 string
	ToolMissing                                      bool
	Waiting                                          bool
	Escalation                                       *uiEscalation
	Request, Downstream, Result                      string
	// DownstreamWhen and DownstreamSource say when and in which event the
	// downstream said what Downstream shows.
	DownstreamWhen, DownstreamSource string
	// AskedNow is the downstream's answer as the page was opened.
	AskedNow *askedNow
	Events   []uiEvent
	Decide   *uiDecideForm
}

type uiEscalation struct {
	Reason, ReasonText, Proposed, Detail string
	// GateWhy and WillRun explain an approval_required wait.
	GateWhy, WillRun string
	CheckFirst       bool
}

type uiEvent struct {
	Seq     int64
	Type    string
	Attempt int
	When    string
	Data    string
}

// uiOperation shows one operation from the event store (the write side),
// so the page right after a decision shows what the decision did.
func (s *UI) uiOperation(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.viewer(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	key := r.PathValue("key")
	if s.server.CheckOperationKey(key) != "" {
		s.renderMessage(w, r, http.StatusNotFound, sess, "Not found", "There is no operation with this key.")
		return
	}
	op, err := s.store.Load(ctx, key)
	if errors.Is(err, store.ErrNotFound) || err == nil && !s.server.MayRead(sess.Principal, sess.Approver, op) {
		s.renderMessage(w, r, http.StatusNotFound, sess, "Not found", "There is no operation with this key.")
		return
	}
	if err != nil {
		s.uiFailure(w, r, sess, "loading the operation", key, err)
		return
	}
	stored, err := s.store.Events(ctx, key, 0)
	if err != nil {
		s.uiFailure(w, r, sess, "loading the operation's events", key, err)
		return
	}
	t, _ := s.tools.Get(op.Tool)
	args := op.Args
	op = s.server.RedactOperation(op, t)
	v := uiOperationView{
		Key: op.Key, Tool: op.Tool, EffectClass: string(op.EffectClass), Status: string(op.Status),
		Phase: string(op.Phase), Principal: op.Principal, DownstreamKey: op.DownstreamKey,
		DownstreamID: op.DownstreamID, LastErrorClass: op.LastErrorClass, Attempt: op.Attempt,
		Created: stamp(op.CreatedAt), Updated: stamp(op.UpdatedAt), ToolMissing: t == nil,
		Waiting: op.Status.AwaitingDecision(), Result: prettyJSON(op.Result),
	}
	// The request shown is the escalation's evidence when there is one and
	// the intent's args otherwise; op went through redactOperation above,
	// like every record the API shows.
	request := op.Args
	var proposed events.Action
	if e := op.Escalation; e != nil {
		v.Escalation = &uiEscalation{Reason: e.Reason, ReasonText: reasonText(e.Reason),
			Proposed: string(e.ProposedAction), Detail: e.Detail, CheckFirst: unknownIrreversible(op)}
		v.Escalation.GateWhy, v.Escalation.WillRun = gateText(op)
		v.Downstream = prettyJSON(e.Downstream)
		if len(e.Request) > 0 && string(e.Request) != "null" {
			request = e.Request
		}
		proposed = e.ProposedAction
	}
	v.Request = prettyJSON(request)
	if v.Waiting {
		v.Decide = decideForm(op, proposed, sess)
		guardForm(v.Decide, op)
	}
	for _, e := range stored {
		// Events appended after the head was read are left out, so the
		// history is the one that folds into the record shown.
		if e.Seq > op.Seq {
			break
		}
		ev, err := s.eventView(e.Envelope, t, args)
		if err != nil {
			s.uiFailure(w, r, sess, "rendering the operation's events", key, err)
			return
		}
		v.Events = append(v.Events, ev)
	}
	if shown, when, source := latestEvidence(v.Events); shown != "" {
		v.Downstream, v.DownstreamWhen, v.DownstreamSource = shown, when, source
	}
	v.AskedNow = askDownstream(ctx, op, t, args)
	s.render(w, r, http.StatusOK, uiOperationPage, uiPage{Title: op.Key, Session: sess,
		Flash: takeFlash(w, r), Data: v})
}

// eventView renders one event for the history. It goes through the JSON
// API's redaction of events, so both show the same thing.
func (s *UI) eventView(e events.Envelope, t tool.Tool, args json.RawMessage) (uiEvent, error) {
	raw, err := s.server.RenderEvent(e, t, args)
	if err != nil {
		return uiEvent{}, err
	}
	var red struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &red); err != nil {
		return uiEvent{}, err
	}
	data := prettyJSON(red.Data)
	if data == "{}" || data == "null" {
		data = ""
	}
	return uiEvent{Seq: e.Seq, Type: string(e.Type), Attempt: e.Attempt, When: stamp(e.OccurredAt), Data: data}, nil
}

// uiDecide records a decision posted from a page and redirects back to the
// operation with what happened. Refusals are messages, not error pages:
// another approver deciding first is part of the job.
func (s *UI) uiDecide(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.formPoster(w, r)
	if !ok {
		return
	}
	if !sess.Approver {
		s.renderMessage(w, r, http.StatusForbidden, sess, "Refused", "Only approvers record decisions.")
		return
	}
	key := r.PathValue("key")
	back := uiOperationHref(key)
	action, err := events.ParseAction(r.PostForm.Get("action"))
	if err != nil {
		setFlash(w, r, uiFlash{Kind: flashError, Text: "Not recorded: choose one of the decision buttons."})
		redirect(w, r, back)
		return
	}
	note := strings.TrimSpace(r.PostForm.Get("note"))
	if action == events.ActionRetry {
		if cur, err := s.store.Load(r.Context(), key); err == nil {
			if why := retryRefusal(cur, note, r.PostForm.Get("confirm_retry") == "yes"); why != "" {
				setFlash(w, r, uiFlash{Kind: flashError, Text: "Not recorded: " + why + "."})
				redirect(w, r, back)
				return
			}
		}
	}
	op, err := s.server.Decide(r.Context(), key, action, note, sess.Principal)
	if err != nil {
		status, detail := s.server.Refusal(err, op)
		if status == http.StatusNotFound {
			back = "/ui/"
		}
		setFlash(w, r, uiFlash{Kind: flashError, Text: "Not recorded: " + detail + "."})
		redirect(w, r, back)
		return
	}
	setFlash(w, r, uiFlash{Kind: flashOK, Text: fmt.Sprintf("Recorded %s on %s: the operation is now %s.", action, key, op.Status)})
	redirect(w, r, back)
}

type uiLoginView struct {
	Open  bool
	Next  string
	Error string
}

func (s *UI) uiLoginForm(w http.ResponseWriter, r *http.Request) {
	sess, _ := s.session(w, r, false)
	s.render(w, r, http.StatusOK, uiLoginPage, uiPage{Title: "Sign in", Session: sess,
		Data: uiLoginView{Open: s.cfg.Open, Next: safeNext(r.URL.Query().Get("next"))}})
}

// uiLogin checks a pasted token and keeps it in the session cookie. A wrong
// token is answered 401 with the form again, and never logged.
func (s *UI) uiLogin(w http.ResponseWriter, r *http.Request) {
	if err := uiCrossOrigin.Check(r); err != nil {
		s.renderMessage(w, r, http.StatusForbidden, uiSession{}, "Refused", "The form was sent from another site.")
		return
	}
	if !s.parseUIForm(w, r) {
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	token := strings.TrimSpace(r.PostForm.Get("token"))
	name, approver, ok := s.server.TokenPrincipal(token)
	if token == "" || !ok {
		s.render(w, r, http.StatusUnauthorized, uiLoginPage, uiPage{Title: "Sign in",
			Data: uiLoginView{Open: s.cfg.Open, Next: next, Error: "That is not a valid API token."}})
		return
	}
	setSessionCookie(w, r, sessionValue(token))
	s.log.InfoContext(r.Context(), "ui sign-in", slog.String("principal", name), slog.Bool("approver", approver))
	redirect(w, r, next)
}

func (s *UI) uiLogout(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.formPoster(w, r); !ok {
		return
	}
	clearCookie(w, r, uiSessionCookie)
	redirect(w, r, "/ui/login")
}

// safeNext returns where to go after signing in: a page of this UI, never
// another site ("//evil.example" and "/\evil.example" are other sites to a
// browser).
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.ContainsAny(next, "\\\r\n") || strings.HasPrefix(next, "/ui//") {
		return "/ui/"
	}
	if u, err := url.Parse(next); err != nil || u.Host != "" || u.Scheme != "" {
		return "/ui/"
	}
	return next
}

// uiStaticFile serves the embedded stylesheet. It needs no session: it holds
// nothing but styles.
func (s *UI) uiStaticFile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	uiSecurityHeaders(w)
	if !fs.ValidPath(name) {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	b, err := fs.ReadFile(uiStatic, name)
	if err != nil {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	h := w.Header()
	h.Set("Content-Type", cmp.Or(mime.TypeByExtension(path.Ext(name)), "application/octet-stream"))
	h.Set("Cache-Control", "public, max-age=86400")
	_, _ = w.Write(b)
}

// uiFailure answers a server-side failure with an error page, logging the
// cause (never args) for the operator.
func (s *UI) uiFailure(w http.ResponseWriter, r *http.Request, sess uiSession, what, key string, err error) {
	ctx := r.Context()
	attrs := []any{slog.Any("error", err)}
	if key != "" {
		attrs = append(attrs, slog.String("operation_key", key))
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		s.log.WarnContext(ctx, "ui: "+what+" did not finish", attrs...)
		w.Header().Set("Retry-After", "1")
		s.renderMessage(w, r, http.StatusServiceUnavailable, sess, "Try again", strings.ToUpper(what[:1])+what[1:]+" did not finish in time. Reload the page.")
		return
	}
	s.log.ErrorContext(ctx, "ui: "+what+" failed", attrs...)
	s.renderMessage(w, r, http.StatusInternalServerError, sess, "Something went wrong", strings.ToUpper(what[:1])+what[1:]+" failed. Reload the page; if it keeps failing, the server's log says why.")
}

// decideForm builds the four decision buttons of a waiting operation, or
// nil for a principal that may not decide. Compensate is shown but disabled
// where the reconciler would refuse it, with the reason as its title.
func decideForm(op events.Operation, proposed events.Action, sess uiSession) *uiDecideForm {
	if !sess.Approver {
		return nil
	}
	f := &uiDecideForm{URL: uiOperationHref(op.Key) + "/decisions", CSRF: sess.CSRF}
	for _, a := range events.Actions() {
		b := uiButton{Action: a, Label: actionLabel(a), Proposed: a == proposed}
		if a == events.ActionCompensate {
			switch {
			case op.EffectClass != events.Compensable:
				b.Disabled, b.Why = true, fmt.Sprintf("%s effects have no undo", op.EffectClass)
			case op.Attempt == 0:
				b.Disabled, b.Why = true, "nothing to undo before the first attempt"
			}
		}
		f.Buttons = append(f.Buttons, b)
	}
	return f
}

func actionLabel(a events.Action) string {
	switch a {
	case events.ActionRecordSuccess:
		return "Record success"
	case events.ActionRetry:
		return "Retry"
	case events.ActionCompensate:
		return "Compensate"
	case events.ActionAbandon:
		return "Abandon"
	}
	return string(a)
}

// reasonText explains an escalation reason (the reconciler's Reason*
// constants) to the approver.
func reasonText(reason string) string {
	switch reason {
	case "absent_downstream":
		return "The downstream shows no effect for this key, and the tool's class (or its spent retry budget) forbids an automatic retry."
	case "cannot_tell":
		return "The downstream was asked repeatedly and never said whether the effect happened."
	case "cannot_ask":
		return "The tool has no reconcile request, so nobody can ask the downstream whether the effect happened."
	case "compensation_failed":
		return "The undo failed or its outcome is unknown, and the effect may still stand."
	case events.ReasonApprovalRequired:
		return "The tool needs an approver's decision before its first attempt; nothing has been sent."
	case "":
		return "The outcome is unknown; the reconciler is asking the downstream."
	}
	return ""
}

func uiOperationHref(key string) string { return "/ui/operations/" + url.PathEscape(key) }

func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// since says how long ago t was, coarsely: a queue is read at a glance.
func since(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return "under a minute"
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h %d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%d days", int(d/(24*time.Hour)))
}

// prettyJSON indents a JSON value for a <pre>, cut at uiMaxJSONBytes.
func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		// Not JSON (it always is, from the store): shown as text, escaped
		// like everything else.
		b.Reset()
		b.Write(raw)
	}
	if b.Len() > uiMaxJSONBytes {
		return strings.ToValidUTF8(string(b.Bytes()[:uiMaxJSONBytes]), "") +
			"\n… (cut; GET /v1/operations/{key} has all of it)"
	}
	return b.String()
}
