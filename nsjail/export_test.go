package nsjail

// NormalizeMap is normalizeMap, for the external tests (template_test.go
// compares id maps the way StartShell does).
var NormalizeMap = normalizeMap
