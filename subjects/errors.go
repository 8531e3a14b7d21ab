package subjects

import "errors"

// Errors returned by the validators and builders. Each is wrapped with the
// offending value; test for them with errors.Is.
var (
	// ErrInvalidToken: a subject token is not the canonical encoding of a name.
	ErrInvalidToken = errors.New("subjects: invalid token")
	// ErrInvalidAgentID: an agent ID is empty, not UTF-8, has control
	// characters, is too long once encoded, or is the reserved broadcast "*".
	ErrInvalidAgentID = errors.New("subjects: invalid agent ID")
	// ErrInvalidType: a message type is empty, not UTF-8, has control
	// characters or is too long once encoded.
	ErrInvalidType = errors.New("subjects: invalid message type")
	// ErrInvalidPriority: a priority is outside 1..5.
	ErrInvalidPriority = errors.New("subjects: invalid priority")
	// ErrInvalidRoot: the subject root is not dot-separated [A-Za-z0-9_-] tokens.
	ErrInvalidRoot = errors.New("subjects: invalid root")
	// ErrInvalidSubject: a subject does not have one of the agentbus forms.
	ErrInvalidSubject = errors.New("subjects: not an agentbus subject")
	// ErrInvalidShard: a shard count is not 1 to MaxShards, or a shard is
	// not one of them.
	ErrInvalidShard = errors.New("subjects: invalid shard")
)
