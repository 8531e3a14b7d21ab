package cli

import (
	"testing"

	"github.com/agentbus/agentbus/embedded"
)

// TEMPORARY until embedded/embeddedtest exists.
func runServerShim(t *testing.T) *embedded.Server {
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}
