package subjects

import "fmt"

// Broadcast is the recipient that means every agent. It is the To of a
// broadcast [Address] and the only value of to that [Scheme.DeadLetter]
// accepts besides an agent ID; no agent may take it as its ID.
const Broadcast = "*"

// Priorities run from 1, the most urgent, to 5. Every agent has two durable
// consumers per priority (direct and broadcast, see [Scheme.Consumers]), so
// the five levels are part of the subject scheme.
const (
	HighestPriority = 1
	LowestPriority  = 5
	DefaultPriority = 3
)

// ValidateID reports whether id can name an agent: it must be non-empty,
// valid UTF-8 without control characters, encode to at most [MaxTokenLen]
// bytes and not be [Broadcast]. Spaces, dots, '@', '*' inside a longer ID and
// any other printable character are allowed; [EncodeToken] escapes them.
// The error wraps [ErrInvalidAgentID].
func ValidateID(id string) error {
	return validateID("agent ID", id)
}

// Operator is the sender of what an operator publishes in agentbus's
// name (the notices of a cancel or a dead letter, escalations, group
// changes). No agent may be called so: it would speak for the operator.
const Operator = "agentbus"

// ValidateIdentity reports whether id can be the agent a process runs as
// or credentials are made for: an agent ID ([ValidateID]) other than
// [Operator]. The error wraps [ErrInvalidAgentID].
func ValidateIdentity(id string) error {
	if id == Operator {
		return fmt.Errorf("%w: agent ID %q is the operator's, reserved", ErrInvalidAgentID, id)
	}
	return ValidateID(id)
}

// validateID is ValidateID with the role of the ID (sender, recipient, ...)
// named in the error.
func validateID(role, id string) error {
	if isPlain(id) {
		return nil
	}
	if id == Broadcast {
		return fmt.Errorf("%w: %s %q is reserved for broadcast", ErrInvalidAgentID, role, id)
	}
	return validateName(role, id, ErrInvalidAgentID)
}

// ValidateType reports whether typ can name a message type. The rules are
// those of [ValidateID] except that "*" is allowed. The error wraps
// [ErrInvalidType].
func ValidateType(typ string) error {
	if isPlain(typ) {
		return nil
	}
	return validateName("message type", typ, ErrInvalidType)
}

// ValidatePriority reports whether p is a priority, [HighestPriority] (1)
// to [LowestPriority] (5). The error wraps [ErrInvalidPriority].
func ValidatePriority(p int) error {
	if p < HighestPriority || p > LowestPriority {
		return fmt.Errorf("%w: %d is outside %d..%d", ErrInvalidPriority, p, HighestPriority, LowestPriority)
	}
	return nil
}
