package bus_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMELibraryIsExample: the README's library snippet is the body of
// Example, copied verbatim, so it compiles and does what it says.
func TestREADMELibraryIsExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "func Example() {\n")
	body, _, ok2 := strings.Cut(body, "\t// Output:")
	if !ok || !ok2 {
		t.Fatal("example_test.go has no Example with an Output comment")
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	_, lib, ok := strings.Cut(string(readme), "## Library\n")
	_, snippet, ok2 := strings.Cut(lib, "```go\n")
	snippet, _, ok3 := strings.Cut(snippet, "```\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md has no go snippet under ## Library")
	}
	if want := strings.Join(lines, "\n") + "\n"; snippet != want {
		t.Errorf("README.md's library snippet is not Example's body; copy it again:\n%s", want)
	}
}
