package subjects

import (
	"encoding/hex"
	"fmt"
	"strconv"
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
//	indexed:     <root>.agent.<to>.p<N>.<from>.<type>.<id>.<conversation>
//	broadcast:   <root>.all.p<N>.<from>.<type>
//	dead letter: <root>.dlq.<to>.<from>.<type>
//
// <to>, <from> and <type> are [EncodeToken] tokens, N is the priority 1..5.
// An indexed subject is a direct one that also names its message: <id> is
// [IndexToken] of the message ID and <conversation> the [ConversationToken]
// of its correlation ID, so that the stream's own subject index finds a
// message by its ID and the messages of a conversation
// ([Scheme.MessageFilters], [Scheme.ConversationFilters]). For the bus's
// own IDs (UUID version 7) both tokens are 4 ms windows of the IDs' time,
// shared by the messages made in them, and a lookup keeps the message it
// looks for from the window's; any other ID has tokens of its own. Package
// bus sends every direct message so when it tracks the lifecycle (its
// default); a publisher that does not is still delivered, only not found
// that way.
const (
	kindAgent = "agent" // token after the root in a direct subject
	kindAll   = "all"   // token after the root in a broadcast subject
	kindDLQ   = "dlq"   // token after the root in a dead-letter subject

	kindProcesses = "processes" // token after the root in an agent's processes subject

	priorityPrefix  = "p"          // "p1".."p5"
	directSep       = "_p"         // direct consumer name: <token>_p<N>
	broadcastSep    = "_b"         // broadcast consumer name: <token>_b
	dlqStreamSuffix = "_DLQ"       // dead-letter stream: <STREAM>_DLQ
	unsettledSuffix = "_UNSETTLED" // MAX_DELIVERIES advisories: <STREAM>_UNSETTLED
	tail            = ">"          // matches the remaining tokens in a filter

	broadcastToken = "%2A" // EncodeToken(Broadcast)
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
	if err := validateDirect(to, from, typ, priority); err != nil {
		return "", err
	}
	root := s.Root()
	var b strings.Builder
	b.Grow(len(root) + len(kindAgent) + encodedLen(to) + len(priorityPrefix) + 1 + encodedLen(from) + encodedLen(typ) + 5)
	writeDirect(&b, root, to, from, typ, priority)
	return b.String(), nil
}

// validateDirect checks the parts of a direct subject.
func validateDirect(to, from, typ string, priority int) error {
	if err := validateID("recipient", to); err != nil {
		return err
	}
	if err := validateID("sender", from); err != nil {
		return err
	}
	if err := ValidateType(typ); err != nil {
		return err
	}
	return ValidatePriority(priority)
}

// writeDirect writes the direct subject <root>.agent.<to>.p<N>.<from>.<type>
// to b.
func writeDirect(b *strings.Builder, root, to, from, typ string, priority int) {
	b.WriteString(root)
	b.WriteString("." + kindAgent + ".")
	writeToken(b, to)
	b.WriteString("." + priorityPrefix)
	b.WriteByte('0' + byte(priority))
	b.WriteByte('.')
	writeToken(b, from)
	b.WriteByte('.')
	writeToken(b, typ)
}

// IndexedDirect returns the indexed subject of message id from agent from
// to agent to in the conversation correlationID names:
// <root>.agent.<to>.p<N>.<from>.<type>.<id>.<conversation>, the subject of
// [Scheme.Direct] followed by [IndexToken](id) and
// [ConversationToken](correlationID). Inputs are validated as in
// [Scheme.Direct], and id must not be empty ([ErrInvalidToken]).
func (s Scheme) IndexedDirect(to, from, typ string, priority int, id, correlationID string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("%w: empty message ID", ErrInvalidToken)
	}
	// Built as Direct builds, in one allocation: the bus calls it for
	// every direct message it sends.
	if err := validateDirect(to, from, typ, priority); err != nil {
		return "", err
	}
	ms, windowed := uuidV7Millis(id)
	var idTok string // for an ID not named by its window
	idLen := windowTokenMaxLen
	if !windowed {
		idTok = IDToken(id)
		idLen = len(idTok)
	}
	root := s.Root()
	var b strings.Builder
	b.Grow(len(root) + len(kindAgent) + encodedLen(to) + len(priorityPrefix) + 1 + encodedLen(from) + encodedLen(typ) +
		idLen + 2*conversationKeyBytes + 7)
	writeDirect(&b, root, to, from, typ, priority)
	b.WriteByte('.')
	if windowed {
		writeWindow(&b, ms)
	} else {
		b.WriteString(idTok)
	}
	b.WriteByte('.')
	if ms, ok := uuidV7Millis(correlationID); ok {
		writeWindow(&b, ms)
		return b.String(), nil
	}
	sum := conversationSum(correlationID)
	var conv [2 * conversationKeyBytes]byte
	hex.Encode(conv[:], sum[:conversationKeyBytes])
	b.Write(conv[:])
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

// DeadLetter returns the subject a message from from is moved to when agent
// to, which received it, gives it up: <root>.dlq.<to>.<from>.<type>. The
// priority is not part of it. to is always the receiving agent, also for a
// broadcast, so that each agent files its dead letters under its own
// subjects (which its permissions allow, see [Scheme.AgentPermissions]); the
// original subject travels in the dead letter's headers. to and from must
// pass [ValidateID] and typ [ValidateType].
func (s Scheme) DeadLetter(to, from, typ string) (string, error) {
	if err := validateID("recipient", to); err != nil {
		return "", err
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
// every direct subject, <root>.agent.*.p<N>.*.*, every indexed one,
// <root>.agent.*.p<N>.*.*.*.*, and every broadcast subject,
// <root>.all.p<N>.*.*, for N in 1..5, in that order. They capture only
// subjects of the scheme's shape: a publish to a priority outside 1..5 or
// with a token too many or too few finds no stream and fails at the
// publisher, rather than being stored and acknowledged where no agent's
// consumer would ever deliver it.
func (s Scheme) StreamSubjects() []string {
	root := s.Root()
	two := "." + anyToken + "." + anyToken
	out := make([]string, 0, 3*LowestPriority)
	for _, kind := range []struct{ prefix, tail string }{
		{kindAgent + "." + anyToken, two}, {kindAgent + "." + anyToken, two + two}, {kindAll, two},
	} {
		for p := HighestPriority; p <= LowestPriority; p++ {
			out = append(out, root+"."+kind.prefix+"."+priorityPrefix+string(rune('0'+p))+kind.tail)
		}
	}
	return out
}

// WithoutIndex returns subject without the index an indexed direct subject
// ends in ([Scheme.IndexedDirect]), and any other subject as it is: the
// destination a message was sent to, shared by every message from one
// agent to another of one type and priority. It reads only the kind and
// counts tokens; Parse checks them.
func (s Scheme) WithoutIndex(subject string) string {
	if k, _ := s.Route(subject); k != KindDirect {
		return subject
	}
	at := len(s.Root()) + 1
	for n, i := 0, at; i < len(subject); i++ {
		if subject[i] == '.' {
			if n++; n == 5 {
				return subject[:i]
			}
		}
	}
	return subject
}

// MessageFilters returns the filter subjects of the indexed subjects of
// message id, whoever sent it to whom: <root>.agent.*.*.*.*.<id>.*, <id>
// its [IndexToken], and for an ID whose token is a window, second, the
// filter of its [IDToken], the subject an earlier version of the bus sent
// it on. The stream's subject index answers them: a status lookup finds a
// message by its ID this way, reading the last message of each subject
// they match and, where that is another message of a window, the window's
// messages. An agent may read only the subjects that name it
// ([Scheme.MessageFiltersOfAgent]).
func (s Scheme) MessageFilters(id string) []string {
	prefix := s.Root() + "." + kindAgent + ".*.*.*.*."
	return indexFilters(IndexToken(id), IDToken(id), func(tok string) string { return prefix + tok + "." + anyToken })
}

// indexFilters returns filter(tok), and filter(earlier) after it if
// earlier is another token: the filters of the subjects a message, or a
// conversation, is sent on now and was sent on by an earlier version of
// the bus, which its lookups read until the stream no longer keeps them.
func indexFilters(tok, earlier string, filter func(tok string) string) []string {
	if tok == earlier {
		return []string{filter(tok)}
	}
	return []string{filter(tok), filter(earlier)}
}

// MessageFiltersOfAgent returns the filter subjects of the indexed
// subjects of message id that name agent, in pairs: as the recipient
// (<root>.agent.<agent>.*.*.*.<id>.*) and as the sender
// (<root>.agent.*.*.<agent>.*.<id>.*), <id> its [IndexToken], and for an
// ID whose token is a window, a second pair with its [IDToken]
// ([Scheme.MessageFilters]). An agent's permissions let it read messages by
// these ([Scheme.AgentPermissions]). The error wraps [ErrInvalidAgentID].
func (s Scheme) MessageFiltersOfAgent(id, agent string) ([]string, error) {
	if err := ValidateID(agent); err != nil {
		return nil, err
	}
	prefix, tok := s.Root()+"."+kindAgent+".", EncodeToken(agent)
	var out []string
	for _, idTok := range indexFilters(IndexToken(id), IDToken(id), func(tok string) string { return tok }) {
		out = append(out,
			prefix+tok+".*.*.*."+idTok+"."+anyToken,
			prefix+"*.*."+tok+".*."+idTok+"."+anyToken)
	}
	return out, nil
}

// MessageFilterBetween returns the filter subject of the indexed subject
// of message id sent by from to to: <root>.agent.<to>.*.<from>.*.<id>.*,
// <id> its [IndexToken]. Either agent's permissions let it read the message
// by it ([Scheme.AgentPermissions]). The error wraps [ErrInvalidAgentID].
func (s Scheme) MessageFilterBetween(id, to, from string) (string, error) {
	for _, a := range []string{to, from} {
		if err := ValidateID(a); err != nil {
			return "", err
		}
	}
	return s.Root() + "." + kindAgent + "." + EncodeToken(to) + ".*." + EncodeToken(from) + ".*." + IndexToken(id) + "." + anyToken, nil
}

// ConversationFilters returns the filter subjects of the indexed subjects
// of the messages of the conversation correlationID names:
// <root>.agent.*.*.*.*.*.<conversation>, <conversation> its
// [ConversationToken], and for a correlation ID whose token is a window,
// second, the filter of its [ConversationKey], which an earlier version of
// the bus sent it under. A window's filter matches the messages of every
// conversation begun in it; a reader keeps those of its own.
func (s Scheme) ConversationFilters(correlationID string) []string {
	prefix := s.Root() + "." + kindAgent + ".*.*.*.*.*."
	return indexFilters(ConversationToken(correlationID), ConversationKey(correlationID), func(tok string) string { return prefix + tok })
}

// ConversationFiltersOfAgent returns the filter subjects of the indexed
// subjects of the messages of the conversation correlationID names that
// name agent, in pairs: as the recipient
// (<root>.agent.<agent>.*.*.*.*.<conversation>) and as the sender
// (<root>.agent.*.*.<agent>.*.*.<conversation>), and a second pair for the
// earlier token as [Scheme.ConversationFilters] has it. They lie within the
// filters of the agent's history consumers ([Scheme.ReceivedHistoryConsumer],
// [Scheme.SentHistoryConsumer]), which its permissions let it create with
// them. The error wraps [ErrInvalidAgentID].
func (s Scheme) ConversationFiltersOfAgent(correlationID, agent string) ([]string, error) {
	if err := ValidateID(agent); err != nil {
		return nil, err
	}
	prefix, tok := s.Root()+"."+kindAgent+".", EncodeToken(agent)
	var out []string
	for _, conv := range indexFilters(ConversationToken(correlationID), ConversationKey(correlationID), func(tok string) string { return tok }) {
		out = append(out,
			prefix+tok+".*.*.*.*."+conv,
			prefix+"*.*."+tok+".*.*."+conv)
	}
	return out, nil
}

// StreamDirectGetPrefix returns the prefix of the JetStream API subject
// that reads the last message of a subject, or of a filter, of the stream
// of s directly: "$JS.API.DIRECT.GET.<stream>.", followed by the subject.
// An agent's permissions allow it for [Scheme.MessageFiltersOfAgent].
func (s Scheme) StreamDirectGetPrefix() string {
	return jsDirectGet + s.Stream() + "."
}

// DeadLetterSubjects returns the subjects of the stream named by
// [Scheme.DeadLetterStream].
func (s Scheme) DeadLetterSubjects() []string {
	return []string{s.Root() + "." + kindDLQ + "." + tail}
}

// Consumer describes one of an agent's durable consumers on the messages
// stream. Each agent has six: one per priority for the messages sent to it
// (its offline queue, read in priority order), and one for the broadcasts
// of every priority, which the subscriber orders by the priority in their
// subjects. Each has one filter subject, so that server permissions can pin
// a consumer's name and filter together: the create request's subject,
// $JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>, carries both.
type Consumer struct {
	// Agent is the agent ID the consumer delivers to.
	Agent string
	// Name is the durable consumer name: the agent's token, then "_p" and
	// the priority for a direct consumer ("reviewer_p2"), or "_b" for the
	// broadcast consumer ("reviewer_b"). It is at most MaxTokenLen+3 bytes
	// and free of the characters the server forbids in names.
	Name string
	// Filter is the consumer's one filter subject:
	// <root>.agent.<token>.p<N>.> for a direct consumer and <root>.all.>
	// for the broadcast one.
	Filter string
	// Priority is the priority of the messages a direct consumer reads,
	// 1..5; 0 for the broadcast consumer, which reads every priority.
	Priority int
	// Broadcast tells the broadcast consumer from the direct ones.
	Broadcast bool
}

// ConsumersPerAgent is how many durable consumers [Scheme.Consumers]
// lists for an agent: one per priority and one for the broadcasts.
const ConsumersPerAgent = LowestPriority + 1

// Consumers returns the durable consumers of agent: the direct consumer of
// each priority, highest first, then the broadcast consumer. Names are
// unique per (agent, priority, kind): a direct name ends in "_p" and a
// digit, the broadcast name in "_b", so an ID such as "a_p1" ("a_p1_p1",
// "a_p1_b") never takes another agent's name. Broadcasts an agent sends
// itself match its own broadcast filter; the caller decides whether to drop
// them. The error wraps [ErrInvalidAgentID].
func (s Scheme) Consumers(agent string) ([]Consumer, error) {
	if err := ValidateID(agent); err != nil {
		return nil, err
	}
	tok := EncodeToken(agent)
	out := make([]Consumer, 0, ConsumersPerAgent)
	for p := HighestPriority; p <= LowestPriority; p++ {
		out = append(out, s.consumer(agent, tok, p, false))
	}
	return append(out, s.consumer(agent, tok, 0, true)), nil
}

// ParseConsumer returns the consumer [Scheme.Consumers] names name, the
// inverse of Consumer.Name: "reviewer_p2" is the direct consumer of
// "reviewer" at priority 2, "reviewer_b" its broadcast consumer. A name that
// is not "<token>_p<N>" or "<token>_b" with a canonical token of a valid
// agent ID and N in 1..5 returns an error wrapping [ErrInvalidToken] and,
// when the agent or the priority is at fault, [ErrInvalidAgentID] or
// [ErrInvalidPriority] as well.
func (s Scheme) ParseConsumer(name string) (Consumer, error) {
	tok, p, broadcast := "", 0, false
	switch i := len(name) - len(directSep) - 1; { // where a direct suffix "_p<N>" starts
	case len(name) > len(broadcastSep) && strings.HasSuffix(name, broadcastSep):
		tok, broadcast = name[:len(name)-len(broadcastSep)], true
	case i >= 1 && name[i:i+2] == directSep:
		p = int(name[len(name)-1]) - '0'
		if err := ValidatePriority(p); err != nil {
			return Consumer{}, fmt.Errorf("%w: consumer name %q: %w", ErrInvalidToken, name, err)
		}
		tok = name[:i]
	default:
		return Consumer{}, fmt.Errorf("%w: consumer name %q does not end in %s<N> or %s", ErrInvalidToken, name, directSep, broadcastSep)
	}
	agent, err := decodeID("agent ID", tok)
	if err != nil {
		return Consumer{}, fmt.Errorf("%w: consumer name %q: %w", ErrInvalidToken, name, err)
	}
	return s.consumer(agent, tok, p, broadcast), nil
}

// consumer builds one consumer of agent, whose token is tok: the direct
// consumer of priority p, or the broadcast consumer.
func (s Scheme) consumer(agent, tok string, p int, broadcast bool) Consumer {
	c := Consumer{Agent: agent, Priority: p, Broadcast: broadcast}
	if broadcast {
		c.Name = tok + broadcastSep
		c.Filter = s.Root() + "." + kindAll + "." + tail
	} else {
		digit := string(rune('0' + p))
		c.Name = tok + directSep + digit
		c.Filter = s.Root() + "." + kindAgent + "." + tok + "." + priorityPrefix + digit + "." + tail
	}
	return c
}

// PriorityOf returns the priority a direct or broadcast subject of s
// carries, reading only its priority token, or 0 if subject is not one of
// them. It costs no allocation: a subscriber calls it for every broadcast
// to order them by priority.
func (s Scheme) PriorityOf(subject string) int {
	_, p := s.Route(subject)
	return p
}

// Route returns the kind (KindDirect or KindBroadcast) and the priority of
// a direct or broadcast subject of s, reading only its kind and priority
// tokens, or 0, 0 if subject is not one of them. It costs no allocation:
// the bus calls it for every message it delivers. Parse checks every
// token.
func (s Scheme) Route(subject string) (Kind, int) {
	root := s.Root()
	if len(subject) <= len(root) || subject[:len(root)] != root || subject[len(root)] != '.' {
		return 0, 0
	}
	rest := subject[len(root)+1:]
	var kind Kind
	switch {
	case strings.HasPrefix(rest, kindAll+"."):
		kind, rest = KindBroadcast, rest[len(kindAll)+1:]
	case strings.HasPrefix(rest, kindAgent+"."):
		rest = rest[len(kindAgent)+1:]
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return 0, 0
		}
		kind, rest = KindDirect, rest[i+1:]
	default:
		return 0, 0
	}
	if len(rest) < 3 || rest[0] != priorityPrefix[0] || rest[2] != '.' {
		return 0, 0
	}
	if p := int(rest[1]) - '0'; p >= HighestPriority && p <= LowestPriority {
		return kind, p
	}
	return 0, 0
}

// Template returns the subjects of kind (KindDirect or KindBroadcast) at
// priority as a template, their agent and type tokens written {to},
// {from} and {type}: "agentbus.agent.{to}.p2.{from}.{type}". It is the
// OpenTelemetry messaging.destination.template of those subjects, whose
// cardinality is low.
func (s Scheme) Template(kind Kind, priority int) string {
	p := "." + priorityPrefix + strconv.Itoa(priority) + "."
	if kind == KindBroadcast {
		return s.Root() + "." + kindAll + p + "{from}.{type}"
	}
	return s.Root() + "." + kindAgent + ".{to}" + p + "{from}.{type}"
}

// DeadLetterFilter returns the filter subject of the dead letters of agent
// (every agent when "") of message type typ (every type when ""):
// <root>.dlq.<agent>.*.<type>. The error wraps [ErrInvalidAgentID] or
// [ErrInvalidToken].
func (s Scheme) DeadLetterFilter(agent, typ string) (string, error) {
	to, t := anyToken, anyToken
	if agent != "" {
		if err := ValidateID(agent); err != nil {
			return "", err
		}
		to = EncodeToken(agent)
	}
	if typ != "" {
		if err := ValidateType(typ); err != nil {
			return "", err
		}
		t = EncodeToken(typ)
	}
	return s.Root() + "." + kindDLQ + "." + to + "." + anyToken + "." + t, nil
}

// MaxDeliveriesAdvisories returns the subject of the server's
// MAX_DELIVERIES advisories for every consumer of the stream of s: a
// message whose last allowed delivery was never settled.
func (s Scheme) MaxDeliveriesAdvisories() string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + s.Stream() + "." + anyToken
}

// UnsettledStream returns the name of the stream that keeps the
// [Scheme.MaxDeliveriesAdvisories] until the dead-letter watcher has
// handled them: [Scheme.Stream] followed by "_UNSETTLED".
func (s Scheme) UnsettledStream() string {
	return s.Stream() + unsettledSuffix
}

// TypeFilters returns the two filter subjects of the direct messages to
// agent of type typ at priority, from any sender, indexed or not:
// <root>.agent.<to>.p<N>.*.<type> and the same followed by ".*.*". The
// errors wrap [ErrInvalidAgentID], [ErrInvalidToken] or
// [ErrInvalidPriority].
func (s Scheme) TypeFilters(to, typ string, priority int) ([]string, error) {
	if err := ValidateID(to); err != nil {
		return nil, err
	}
	if err := ValidateType(typ); err != nil {
		return nil, err
	}
	if err := ValidatePriority(priority); err != nil {
		return nil, err
	}
	f := s.Root() + "." + kindAgent + "." + EncodeToken(to) + "." + priorityPrefix + strconv.Itoa(priority) + "." + anyToken + "." + EncodeToken(typ)
	return []string{f, f + "." + anyToken + "." + anyToken}, nil
}

// HistoryConsumer returns the name of the short-lived consumer agent reads
// its own past messages with, "<token>_h" (no agent's durable consumer ends
// so: theirs end in "_p<N>" or "_b"), and the filter of the messages to
// agent from sender: <root>.agent.<to>.*.<from>.>. A bus re-attaching to a
// request reads its updates and reply with it (bus.Bus.Attach); the
// agent's permissions allow exactly this consumer on its own subjects
// (Scheme.AgentPermissions). The error wraps [ErrInvalidAgentID].
func (s Scheme) HistoryConsumer(agent, sender string) (name, filter string, err error) {
	if err := validateID("recipient", agent); err != nil {
		return "", "", err
	}
	if err := validateID("sender", sender); err != nil {
		return "", "", err
	}
	tok := EncodeToken(agent)
	return tok + historySep, s.Root() + "." + kindAgent + "." + tok + "." + anyToken + "." + EncodeToken(sender) + "." + tail, nil
}

// historySep ends the name of an agent's history consumer.
const historySep = "_h"

// The suffixes of the two other short-lived consumers an agent reads its
// part of a conversation with (bus.Bus.History): "_hs" for what it sent,
// "_ha" for the broadcasts. No other consumer name ends in "s" or "a".
const (
	sentHistorySep      = "_hs"
	broadcastHistorySep = "_ha"
)

// ReceivedHistoryConsumer returns the name and the filter of the
// short-lived consumer agent reads the direct messages sent to it with,
// every sender and priority: "<token>_h" (the name of [Scheme.HistoryConsumer])
// and <root>.agent.<token>.>. The error wraps [ErrInvalidAgentID].
func (s Scheme) ReceivedHistoryConsumer(agent string) (name, filter string, err error) {
	filter, err = s.AgentFilter(agent)
	if err != nil {
		return "", "", err
	}
	return EncodeToken(agent) + historySep, filter, nil
}

// SentHistoryConsumer returns the name and the filter of the short-lived
// consumer agent reads the direct messages it sent with:
// "<token>_hs" and <root>.agent.*.*.<token>.>, every recipient, priority
// and type with agent in the sender's place, indexed or not. The agent's permissions allow
// exactly this filter ([Scheme.AgentPermissions]), the subjects it may
// publish to. The error wraps [ErrInvalidAgentID].
func (s Scheme) SentHistoryConsumer(agent string) (name, filter string, err error) {
	if err := ValidateID(agent); err != nil {
		return "", "", err
	}
	tok := EncodeToken(agent)
	return tok + sentHistorySep, s.Root() + "." + kindAgent + "." + anyToken + "." + anyToken + "." + tok + "." + tail, nil
}

// BroadcastHistoryConsumer returns the name and the filter of the
// short-lived consumer agent reads the broadcasts with, its own and every
// other agent's, all of which it receives: "<token>_ha" and <root>.all.>.
// The error wraps [ErrInvalidAgentID].
func (s Scheme) BroadcastHistoryConsumer(agent string) (name, filter string, err error) {
	if err := ValidateID(agent); err != nil {
		return "", "", err
	}
	return EncodeToken(agent) + broadcastHistorySep, s.Root() + "." + kindAll + "." + tail, nil
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
