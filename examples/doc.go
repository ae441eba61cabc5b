// Package examples runs the example programs under it, each a module of
// its own that uses effectline as another module would: through its public
// packages only. A module outside this one cannot import internal/, so an
// example that builds is the proof that those packages are enough.
package examples
