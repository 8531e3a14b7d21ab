package profiles_test

import (
	"errors"
	"fmt"

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
