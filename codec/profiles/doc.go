// Package profiles maps the native message formats agents already speak
// onto [codec.Message], so an agent can use agentbus without changing its
// messages.
//
// A [Profile] knows one format. Five are built in, each after one document
// in shared/protocols:
//
//   - "frontmatter" ([Frontmatter]): a YAML envelope (type, signal, typed
//     fields) between "---" lines, then a Markdown body.
//   - "basemessage" ([BaseMessage]): JSON with messageId, correlationId,
//     timestamp, from, to, type, version and payload.
//   - "swarm" ([Swarm]): JSON handoffs named by a schema member.
//   - "coordination" ([Coordination]): JSON task_assignment, status_update,
//     question and result messages.
//   - "pipeline" ([Pipeline]): JSON Pipeline Broker messages with a numeric
//     priority.
//
// docs/protocols.md in the repository has the field mapping, priority
// table, strictness and defaults of each.
//
// # Publishing
//
// Look the profile up by name and hand it the native bytes. Prepare decodes
// and validates in one step, the way a publisher should:
//
//	p, _ := profiles.Lookup("coordination")
//	m, err := profiles.Prepare(p, native, profiles.Addressing{From: "worker-1"})
//	if err != nil { // errors.Is(err, profiles.ErrInvalid)
//		var ve *profiles.ValidationError
//		errors.As(err, &ve) // ve.Findings name each field and rule
//		return err
//	}
//	m.SetDefaults(time.Now())
//	// encode m with a codec and publish
//
// Decode takes From, To, Type, Priority, CorrelationID, CausationID, Time and
// ID from the native fields where the format has them. [Addressing] fills
// in what it lacks: swarm and front-matter messages carry no addressing, so
// the publishing agent is the sender and the recipient comes from the
// call. Addressing.Priority, when set, overrides the profile's priority.
// Data is the native bytes, never re-encoded, so the receiver gets them
// back byte for byte; ContentType is "application/json" or "text/markdown"
// and DataSchema is "urn:agentbus:profile:<name>:<version>", which
// [ForDataSchema] maps back to the profile.
//
// # Validation
//
// Validate applies the document's rules and returns a *[ValidationError]
// listing every [Finding]: the field as a JSON pointer and the rule, a JSON
// Schema keyword ("required", "enum", "maxLength", ...) or the name of one
// of the document's hard rules ("critical_count>0 requires signal=fail").
// The JSON formats and the front-matter envelope are checked against JSON
// Schemas (draft 2020-12) embedded in the package and published in
// docs/schemas, so agents can validate on their side; [SchemaJSON] returns
// them.
//
// Strict profiles reject an invalid message: Prepare returns the error.
// Coordination is lenient, as its document asks: Prepare returns the
// Message with the findings attached in the [ExtFindings] extension, and
// the receiver reads them with [AttachedFindings].
//
// # Errors to the sender
//
// A basemessage receiver answers invalid input with a MESSAGE_ERROR:
// [ErrorCode] turns the validation error into INVALID_FORMAT, UNKNOWN_TYPE
// or MISSING_FIELD and [BaseMessage.ErrorReply] writes the reply with
// originalMessageId and the original correlationId.
//
// # Defaults
//
// [Profile.Defaults] returns the delivery settings a document specifies:
// for basemessage a 5 minute request timeout, a 30 minute correlation
// timeout, 3 publish attempts, a 1 hour dedup window and 30 days of
// retention. Zero fields leave the bus defaults.
package profiles
