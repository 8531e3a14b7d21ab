package profiles_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentbus/agentbus/codec/profiles"
)

func Example() {
	p, _ := profiles.Lookup("pipeline")
	native := []byte(`{"id":"msg-1","from":"pm","to":"dev","subject":"needs_human",` +
		`"body":{"reason":"dev offline","type":"disconnect"},"timestamp":"2026-04-11T01:10:00Z","replyTo":null}`)

	m, err := profiles.Prepare(p, native, profiles.Addressing{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(m.ID, m.From, "->", m.To, m.Type, "priority", m.Priority)
	fmt.Println(m.DataSchema, m.ContentType, string(m.Data) == string(native))

	// A strict profile refuses a message that breaks its document.
	_, err = profiles.Prepare(p, []byte(`{"id":"msg-2","from":"pm","to":"dev","subject":"stop","body":{}}`), profiles.Addressing{})
	var ve *profiles.ValidationError
	if errors.As(err, &ve) {
		for _, f := range ve.Findings {
			fmt.Println(f.Field, f.Rule)
		}
	}
	// Output:
	// msg-1 pm -> dev needs_human priority 2
	// urn:agentbus:profile:pipeline:1.0 application/json true
	// /body/reason required
	// /timestamp required
}

func ExampleBaseMessage_ErrorReply() {
	bm := profiles.BaseMessage{}
	native := []byte(`{"messageId":"req-123","correlationId":"task-001","timestamp":"2024-01-01T12:00:00Z",` +
		`"from":"planner","to":"validator","type":"VALIDATION_REQUEST","version":"1.0","payload":{"taskId":"T"}}`)
	err := bm.Validate(native)
	fmt.Println(profiles.ErrorCode(err))
	// Output:
	// MISSING_FIELD
}

// show prepares the native message in testdata/<profile>/<file> and prints
// what the bus makes of it.
func show(p profiles.Profile, file string, addr profiles.Addressing) {
	native, err := os.ReadFile(filepath.Join("testdata", p.Name(), file))
	if err != nil {
		fmt.Println(err)
		return
	}
	m, err := profiles.Prepare(p, native, addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s -> %s %s p%d conversation %q strict %v\n", m.From, m.To, m.Type, m.Priority, m.CorrelationID, p.Strict())
}

// A front-matter document carries no addressing: the publisher gives it.
func ExampleFrontmatter() {
	show(profiles.Frontmatter{}, "task_assignment.md", profiles.Addressing{From: "orchestrator", To: "worker"})
	// Output:
	// orchestrator -> worker task_assignment p3 conversation "" strict true
}

func ExampleBaseMessage() {
	show(profiles.BaseMessage{}, "task_assignment.json", profiles.Addressing{})
	// Output:
	// build orchestrator -> @agent-fullstack-developer TASK_ASSIGNMENT p3 conversation "task-001" strict true
}

func ExampleSwarm() {
	show(profiles.Swarm{}, "component_assignment.json", profiles.Addressing{From: "coordinator", To: "worker"})
	// Output:
	// coordinator -> worker ComponentAssignment p3 conversation "C1" strict true
}

// Coordination is lenient: a message that breaks its rules is delivered
// with the findings attached.
func ExampleCoordination() {
	show(profiles.Coordination{}, "question.json", profiles.Addressing{})
	// Output:
	// database-build-agent -> orchestrator question p2 conversation "task-001" strict false
}

func ExamplePipeline() {
	show(profiles.Pipeline{}, "message.json", profiles.Addressing{})
	// Output:
	// pm -> dev develop p4 conversation "" strict true
}
