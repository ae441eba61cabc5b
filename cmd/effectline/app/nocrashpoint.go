//go:build !crashpoints

package app

// crashPoint is the production build's: no crash hook, and no environment
// variable read for one. The crash tests build with -tags crashpoints
// (crashpoint.go).
func crashPoint(func(string) string) func(string) { return nil }
