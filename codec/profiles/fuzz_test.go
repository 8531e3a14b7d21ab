package profiles_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbus/agentbus/codec/profiles"
)

// fuzzDecode seeds f with the profile's testdata and checks that Decode and
// Validate never panic and that whatever Decode accepts keeps the input as
// Data and is a Message the codecs can carry.
func fuzzDecode(f *testing.F, p profiles.Profile) {
	files, _ := filepath.Glob(filepath.Join("testdata", p.Name(), "*"))
	more, _ := filepath.Glob(filepath.Join("testdata", p.Name(), "*", "*"))
	for _, file := range append(files, more...) {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{}`))
	f.Add([]byte("---\n---\n"))
	f.Fuzz(func(t *testing.T, native []byte) {
		orig := bytes.Clone(native)
		_ = p.Validate(native)
		m, err := p.Decode(native, profiles.Addressing{From: "sender", To: "receiver"})
		if err != nil {
			return
		}
		if !bytes.Equal(m.Data, orig) || !bytes.Equal(native, orig) {
			t.Fatal("Data is not the input")
		}
		c := *m
		c.ID = "fuzz"
		if err := c.Validate(); err != nil {
			t.Fatalf("Decode accepted a Message that does not validate: %v", err)
		}
	})
}

func FuzzDecodeFrontmatter(f *testing.F)  { fuzzDecode(f, profiles.Frontmatter{}) }
func FuzzDecodeBaseMessage(f *testing.F)  { fuzzDecode(f, profiles.BaseMessage{}) }
func FuzzDecodeSwarm(f *testing.F)        { fuzzDecode(f, profiles.Swarm{}) }
func FuzzDecodeCoordination(f *testing.F) { fuzzDecode(f, profiles.Coordination{}) }
func FuzzDecodePipeline(f *testing.F)     { fuzzDecode(f, profiles.Pipeline{}) }
