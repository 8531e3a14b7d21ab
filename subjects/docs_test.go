package subjects

import (
	"os"
	"strings"
	"testing"
)

// TestDocsTokenTable keeps the examples in docs/subjects.md true: every row
// of the token table must be what EncodeToken produces.
func TestDocsTokenTable(t *testing.T) {
	b, err := os.ReadFile("../docs/subjects.md")
	if err != nil {
		t.Fatalf("docs/subjects.md is part of the contract: %v", err)
	}
	doc := string(b)
	_, table, ok := strings.Cut(doc, "<!-- token-table")
	if ok {
		table, _, ok = strings.Cut(table, "<!-- end token-table -->")
	}
	if !ok {
		t.Fatal("docs/subjects.md has no token-table markers")
	}
	rows := 0
	for line := range strings.Lines(table) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) != 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		id, tok := code(cells[1]), code(cells[2])
		rows++
		if got := EncodeToken(id); got != tok {
			t.Errorf("docs: %q -> %q, EncodeToken gives %q", id, tok, got)
		}
		if got, err := DecodeToken(tok); err != nil || got != id {
			t.Errorf("docs: DecodeToken(%q) = %q, %v, want %q", tok, got, err, id)
		}
	}
	if rows < 10 {
		t.Errorf("found %d rows in the docs token table, want at least 10", rows)
	}
}

// code returns the text between the first pair of backquotes in cell.
func code(cell string) string {
	_, rest, _ := strings.Cut(cell, "`")
	s, _, _ := strings.Cut(rest, "`")
	return s
}
