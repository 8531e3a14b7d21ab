package subjects

import (
	"fmt"
	"strings"
)

// DefaultRoot is the first token of every subject when no root is chosen.
const DefaultRoot = "agentbus"

// maxRootLen bounds a root so that stream names stay short.
const maxRootLen = 64

// The subject scheme. Every subject and filter agentbus uses is one of these
// templates; this file is the only place that spells them out.
//
//	direct:      <root>.agent.<to>.p<N>.<from>.<type>
//	broadcast:   <root>.all.p<N>.<from>.<type>
//	dead letter: <root>.dlq.<to>.<from>.<type>
//
// <to>, <from> and <type> are [EncodeToken] tokens, N is the priority 1..5.
const (
	kindAgent = "agent" // token after the root in a direct subject
	kindAll   = "all"   // token after the root in a broadcast subject
	kindDLQ   = "dlq"   // token after the root in a dead-letter subject

	priorityPrefix  = "p"    // "p1".."p5"
	consumerSep     = "_p"   // consumer name: <token>_p<N>
	dlqStreamSuffix = "_DLQ" // dead-letter stream: <STREAM>_DLQ
	tail            = ">"    // matches the remaining tokens in a filter

	broadcastToken = "%2A" // EncodeToken(Broadcast), the <to> of a broadcast dead letter
)

// Scheme builds and parses the subjects under one root. Values are small
// and immutable; pass them by value. The zero Scheme behaves as [Default].
type Scheme struct {
	root string
}

// New returns the scheme rooted at root; "" means [DefaultRoot]. A root is
// one or more dot-separated tokens of [A-Za-z0-9_-], at most 64 bytes in all,
// such as "agentbus" or "prod.bus-1". Anything else returns an error wrapping
// [ErrInvalidRoot].
func New(root string) (Scheme, error) {
	if root == "" {
		return Scheme{root: DefaultRoot}, nil
	}
	if len(root) > maxRootLen {
		return Scheme{}, fmt.Errorf("%w: %q is %d bytes, more than %d", ErrInvalidRoot, root, len(root), maxRootLen)
	}
	start := 0
	for i := 0; i <= len(root); i++ {
		if i < len(root) && root[i] != '.' {
			if !unreserved(root[i]) {
				return Scheme{}, fmt.Errorf("%w: %q has byte %q at %d; only [A-Za-z0-9_-] and '.' between tokens are allowed", ErrInvalidRoot, root, root[i], i)
			}
			continue
		}
		if i == start {
			return Scheme{}, fmt.Errorf("%w: %q has an empty token at %d", ErrInvalidRoot, root, i)
		}
		start = i + 1
	}
	return Scheme{root: root}, nil
}

// Default returns the scheme rooted at [DefaultRoot].
func Default() Scheme {
	return Scheme{root: DefaultRoot}
}

// Root returns the root every subject of s starts with.
func (s Scheme) Root() string {
	if s.root == "" {
		return DefaultRoot
	}
	return s.root
}

// Direct returns the subject of a message from agent from to agent to:
// <root>.agent.<to>.p<N>.<from>.<type>. to and from must pass [ValidateID]
// (so to cannot be [Broadcast]; use [Scheme.Broadcast]), typ [ValidateType]
// and priority [ValidatePriority]; the error wraps the matching sentinel.
func (s Scheme) Direct(to, from, typ string, priority int) (string, error) {
	if err := validateID("recipient", to); err != nil {
		return "", err
	}
	if err := validateID("sender", from); err != nil {
		return "", err
	}
	if err := ValidateType(typ); err != nil {
		return "", err
	}
	if err := ValidatePriority(priority); err != nil {
		return "", err
	}
	root := s.Root()
	var b strings.Builder
	b.Grow(len(root) + len(kindAgent) + encodedLen(to) + len(priorityPrefix) + 1 + encodedLen(from) + encodedLen(typ) + 5)
	b.WriteString(root)
	b.WriteString("." + kindAgent + ".")
	writeToken(&b, to)
	b.WriteString("." + priorityPrefix)
	b.WriteByte('0' + byte(priority))
	b.WriteByte('.')
	writeToken(&b, from)
	b.WriteByte('.')
	writeToken(&b, typ)
	return b.String(), nil
}

// Broadcast returns the subject of a message from agent from to every agent:
// <root>.all.p<N>.<from>.<type>. Inputs are validated as in [Scheme.Direct].
func (s Scheme) Broadcast(from, typ string, priority int) (string, error) {
	if err := validateID("sender", from); err != nil {
		return "", err
	}
	if err := ValidateType(typ); err != nil {
		return "", err
	}
	if err := ValidatePriority(priority); err != nil {
		return "", err
	}
	root := s.Root()
	var b strings.Builder
	b.Grow(len(root) + len(kindAll) + len(priorityPrefix) + 1 + encodedLen(from) + encodedLen(typ) + 4)
	b.WriteString(root)
	b.WriteString("." + kindAll + "." + priorityPrefix)
	b.WriteByte('0' + byte(priority))
	b.WriteByte('.')
	writeToken(&b, from)
	b.WriteByte('.')
	writeToken(&b, typ)
	return b.String(), nil
}

// DeadLetter returns the subject a message from from to to is moved to when
// it cannot be delivered: <root>.dlq.<to>.<from>.<type>. The priority is not
// part of it. to is an agent ID or [Broadcast] (written "%2A"); from must pass
// [ValidateID] and typ [ValidateType].
func (s Scheme) DeadLetter(to, from, typ string) (string, error) {
	if to != Broadcast {
		if err := validateID("recipient", to); err != nil {
			return "", err
		}
	}
	if err := validateID("sender", from); err != nil {
		return "", err
	}
	if err := ValidateType(typ); err != nil {
		return "", err
	}
	root := s.Root()
	var b strings.Builder
	b.Grow(len(root) + len(kindDLQ) + encodedLen(to) + encodedLen(from) + encodedLen(typ) + 4)
	b.WriteString(root)
	b.WriteString("." + kindDLQ + ".")
	writeToken(&b, to)
	b.WriteByte('.')
	writeToken(&b, from)
	b.WriteByte('.')
	writeToken(&b, typ)
	return b.String(), nil
}

// Stream returns the name of the stream that holds the direct and broadcast
// messages of s: the root upper-cased with '.' replaced by '_', so
// "agentbus" gives "AGENTBUS" and "prod.bus-1" gives "PROD_BUS-1". Roots that
// differ only in case or in '.' against '_' share a stream name.
func (s Scheme) Stream() string {
	return strings.ToUpper(strings.ReplaceAll(s.Root(), ".", "_"))
}

// DeadLetterStream returns the name of the dead-letter stream: [Scheme.Stream]
// followed by "_DLQ".
func (s Scheme) DeadLetterStream() string {
	return s.Stream() + dlqStreamSuffix
}

// StreamSubjects returns the subjects of the stream named by [Scheme.Stream]:
// every direct and every broadcast subject of s.
func (s Scheme) StreamSubjects() []string {
	root := s.Root()
	return []string{
		root + "." + kindAgent + "." + tail,
		root + "." + kindAll + "." + tail,
	}
}

// DeadLetterSubjects returns the subjects of the stream named by
// [Scheme.DeadLetterStream].
func (s Scheme) DeadLetterSubjects() []string {
	return []string{s.Root() + "." + kindDLQ + "." + tail}
}

// ConsumerName returns the name of the durable consumer that delivers to
// agent the messages of one priority: the agent's token, "_p" and the
// priority, such as "orchestrator_p1". It is unique per (agent, priority),
// at most MaxTokenLen+3 bytes and free of the characters the server forbids
// in names. The error wraps [ErrInvalidAgentID] or [ErrInvalidPriority].
func (s Scheme) ConsumerName(agent string, priority int) (string, error) {
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	if err := ValidatePriority(priority); err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(encodedLen(agent) + len(consumerSep) + 1)
	writeToken(&b, agent)
	b.WriteString(consumerSep)
	b.WriteByte('0' + byte(priority))
	return b.String(), nil
}

// ConsumerFilters returns the filter subjects of the consumer named by
// [Scheme.ConsumerName]: the direct messages to agent and all broadcasts, both
// of the given priority.
//
//	<root>.agent.<token>.p<N>.>
//	<root>.all.p<N>.>
//
// Broadcasts an agent sends itself match its own filters; the caller decides
// whether to drop them. Errors are those of [Scheme.ConsumerName].
func (s Scheme) ConsumerFilters(agent string, priority int) ([]string, error) {
	if err := ValidateID(agent); err != nil {
		return nil, err
	}
	if err := ValidatePriority(priority); err != nil {
		return nil, err
	}
	root := s.Root()
	p := priorityPrefix + string(rune('0'+priority))
	return []string{
		root + "." + kindAgent + "." + EncodeToken(agent) + "." + p + "." + tail,
		root + "." + kindAll + "." + p + "." + tail,
	}, nil
}

// AgentFilter returns the filter subject of every direct message to agent,
// whatever its priority: <root>.agent.<token>.>. It is meant for tools that
// inspect an agent's backlog. The error wraps [ErrInvalidAgentID].
func (s Scheme) AgentFilter(agent string) (string, error) {
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	return s.Root() + "." + kindAgent + "." + EncodeToken(agent) + "." + tail, nil
}
