package ui

import "testing"

func TestSafeNext(t *testing.T) {
	t.Parallel()
	for next, want := range map[string]string{
		"":                         "/ui/",
		"/ui/operations/a%2Fb":     "/ui/operations/a%2Fb",
		"/ui/?x=1":                 "/ui/?x=1",
		"https://evil.example/ui/": "/ui/",
		"//evil.example/ui/":       "/ui/",
		"/ui//evil.example":        "/ui/",
		"/ui/\\evil":               "/ui/",
		"/v1/operations":           "/ui/",
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}
