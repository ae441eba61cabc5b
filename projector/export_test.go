package projector

// RebuildPaged is Rebuild with small pages, so a test can make operations
// straddle page boundaries without journaling thousands of events.
var RebuildPaged = rebuild
