package subjects

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind tells the three subject forms apart. The zero Kind is none of them.
type Kind int

// The subject forms.
const (
	KindDirect     Kind = iota + 1 // <root>.agent.<to>.p<N>.<from>.<type>[.<id>.<conversation>]
	KindBroadcast                  // <root>.all.p<N>.<from>.<type>
	KindDeadLetter                 // <root>.dlq.<to>.<from>.<type>
)

// String returns "direct", "broadcast" or "dead-letter", or "Kind(N)" for
// any other value.
func (k Kind) String() string {
	switch k {
	case KindDirect:
		return "direct"
	case KindBroadcast:
		return "broadcast"
	case KindDeadLetter:
		return "dead-letter"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Address is a subject taken apart, with every token decoded.
type Address struct {
	// Kind is the subject form. The zero Kind is invalid.
	Kind Kind
	// To is the recipient agent ID: [Broadcast] for KindBroadcast, and for
	// KindDeadLetter the agent that received the message and gave it up.
	To string
	// From is the sender agent ID.
	From string
	// Type is the message type.
	Type string
	// Priority is 1..5 for KindDirect and KindBroadcast and 0 for
	// KindDeadLetter, whose subjects carry no priority.
	Priority int
	// Index is what an indexed direct subject says of its message
	// ([Scheme.IndexedDirect]); zero for any other subject.
	Index Index
}

// Index is what an indexed direct subject names besides its address: the
// message ID as its [IndexToken] (the ID itself cannot always be recovered:
// a UUID version 7 is named by its time's window, a long ID is hashed) and
// the [ConversationToken] of the message's correlation ID.
type Index struct {
	ID           string
	Conversation string
}

// parseIndex checks the two index tokens of a subject. A receiver calls it
// for every indexed message, so the common ID, a UUID or any other that
// needs no escaping, is checked in one pass.
func parseIndex(idTok, conv string) (Index, error) {
	if (len(conv) != 2*conversationKeyBytes || !isLowerHex(conv)) && !isWindowToken(conv) {
		return Index{}, fmt.Errorf("%w: conversation token %q is neither 32 lower-case hex digits nor a window", ErrInvalidToken, conv)
	}
	if idTok != "" && len(idTok) <= maxKeyIDLen && encodedLen(idTok) == len(idTok) || isWindowToken(idTok) {
		return Index{ID: idTok, Conversation: conv}, nil // its own token, or its window's
	}
	if h, ok := strings.CutPrefix(idTok, hashedIDPrefix); ok {
		if len(h) != 64 || !isLowerHex(h) {
			return Index{}, fmt.Errorf("%w: hashed message ID token %q", ErrInvalidToken, idTok)
		}
		return Index{ID: idTok, Conversation: conv}, nil
	}
	id, err := DecodeToken(fromKeyToken(idTok))
	if err == nil && (id == "" || IDToken(id) != idTok) {
		err = fmt.Errorf("%w: %q is not the canonical token of a message ID", ErrInvalidToken, idTok)
	}
	if err != nil {
		return Index{}, fmt.Errorf("message ID: %w", err)
	}
	return Index{ID: idTok, Conversation: conv}, nil
}

// Subject rebuilds the subject of a under s with [Scheme.Direct],
// [Scheme.Broadcast] or [Scheme.DeadLetter]; s.Parse of the result returns a.
// Besides the builders' checks, a broadcast address must have To ==
// [Broadcast] (else [ErrInvalidAgentID]) and a dead-letter address Priority 0
// (else [ErrInvalidPriority]); an unknown Kind returns [ErrInvalidSubject].
func (a Address) Subject(s Scheme) (string, error) {
	switch a.Kind {
	case KindDirect:
		subject, err := s.Direct(a.To, a.From, a.Type, a.Priority)
		if err != nil || a.Index == (Index{}) {
			return subject, err
		}
		if _, err := parseIndex(a.Index.ID, a.Index.Conversation); err != nil {
			return "", err
		}
		return subject + "." + a.Index.ID + "." + a.Index.Conversation, nil
	case KindBroadcast:
		if a.To != Broadcast {
			return "", fmt.Errorf("%w: broadcast address has recipient %q, want %q", ErrInvalidAgentID, a.To, Broadcast)
		}
		return s.Broadcast(a.From, a.Type, a.Priority)
	case KindDeadLetter:
		if a.Priority != 0 {
			return "", fmt.Errorf("%w: dead-letter address has priority %d, want 0", ErrInvalidPriority, a.Priority)
		}
		return s.DeadLetter(a.To, a.From, a.Type)
	}
	return "", fmt.Errorf("%w: address has unknown kind %v", ErrInvalidSubject, a.Kind)
}

// isLowerHex reports whether s is made of lower-case hex digits only.
func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Parse takes apart a subject built by s. It accepts exactly the subjects
// the builders of s return: the root of s, one of the three forms with the
// right number of tokens (a direct subject with or without its index), a priority "p1".."p5" where one belongs, and
// canonical tokens that decode to valid IDs and types. Anything else,
// including a subject under another root, returns an error wrapping
// [ErrInvalidSubject]; when a token is at fault the error also wraps the
// token's sentinel ([ErrInvalidToken], [ErrInvalidAgentID], [ErrInvalidType]
// or [ErrInvalidPriority]), so errors.Is works for either.
func (s Scheme) Parse(subject string) (Address, error) {
	root := s.Root()
	if len(subject) <= len(root) || subject[len(root)] != '.' || subject[:len(root)] != root {
		return Address{}, fmt.Errorf("%w: %q is not under root %q", ErrInvalidSubject, subject, root)
	}
	// A valid subject has at most 7 tokens after the root.
	var tok [7]string
	n := 0
	for rest := subject[len(root)+1:]; ; n++ {
		if n == len(tok) {
			return Address{}, fmt.Errorf("%w: %q has more than %d tokens after the root", ErrInvalidSubject, subject, len(tok))
		}
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			tok[n] = rest
			n++
			break
		}
		tok[n], rest = rest[:i], rest[i+1:]
	}

	var (
		a   Address
		err error
	)
	switch tok[0] {
	case kindAgent:
		if n != 5 && n != 7 {
			return Address{}, fmt.Errorf("%w: %q has %d tokens after the root, a direct subject has 5, or 7 when indexed", ErrInvalidSubject, subject, n)
		}
		a.Kind = KindDirect
		if n == 7 {
			if a.Index, err = parseIndex(tok[5], tok[6]); err != nil {
				break
			}
		}
		if a.To, err = decodeID("recipient", tok[1]); err != nil {
			break
		}
		if a.Priority, err = parsePriority(tok[2]); err != nil {
			break
		}
		if a.From, err = decodeID("sender", tok[3]); err != nil {
			break
		}
		a.Type, err = decodeType(tok[4])
	case kindAll:
		if n != 4 {
			return Address{}, arity(subject, KindBroadcast, n, 4)
		}
		a.Kind, a.To = KindBroadcast, Broadcast
		if a.Priority, err = parsePriority(tok[1]); err != nil {
			break
		}
		if a.From, err = decodeID("sender", tok[2]); err != nil {
			break
		}
		a.Type, err = decodeType(tok[3])
	case kindDLQ:
		if n != 4 {
			return Address{}, arity(subject, KindDeadLetter, n, 4)
		}
		a.Kind = KindDeadLetter
		if a.To, err = decodeID("recipient", tok[1]); err != nil {
			break
		}
		if a.From, err = decodeID("sender", tok[2]); err != nil {
			break
		}
		a.Type, err = decodeType(tok[3])
	default:
		return Address{}, fmt.Errorf("%w: %q: token %q after the root is none of %q, %q, %q",
			ErrInvalidSubject, subject, tok[0], kindAgent, kindAll, kindDLQ)
	}
	if err != nil {
		return Address{}, fmt.Errorf("%w: %q: %w", ErrInvalidSubject, subject, err)
	}
	return a, nil
}

func arity(subject string, k Kind, got, want int) error {
	return fmt.Errorf("%w: %q has %d tokens after the root, a %v subject has %d", ErrInvalidSubject, subject, got, k, want)
}

// decodeID decodes an agent ID token and validates the ID.
func decodeID(role, tok string) (string, error) {
	if isPlain(tok) {
		return tok, nil
	}
	id, err := DecodeToken(tok)
	if err != nil {
		return "", fmt.Errorf("%s: %w", role, err)
	}
	if err := validateID(role, id); err != nil {
		return "", err
	}
	return id, nil
}

// decodeRecipient is decodeID that also accepts [Broadcast].
func decodeRecipient(tok string) (string, error) {
	if tok == broadcastToken {
		return Broadcast, nil
	}
	return decodeID("recipient", tok)
}

// decodeType decodes a message type token and validates the type.
func decodeType(tok string) (string, error) {
	if isPlain(tok) {
		return tok, nil
	}
	typ, err := DecodeToken(tok)
	if err != nil {
		return "", fmt.Errorf("message type: %w", err)
	}
	if err := ValidateType(typ); err != nil {
		return "", err
	}
	return typ, nil
}

// parsePriority parses "p1".."p5".
func parsePriority(tok string) (int, error) {
	if len(tok) == len(priorityPrefix)+1 && tok[:len(priorityPrefix)] == priorityPrefix {
		if p := int(tok[len(priorityPrefix)] - '0'); p >= HighestPriority && p <= LowestPriority {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: token %q is not p%d..p%d", ErrInvalidPriority, tok, HighestPriority, LowestPriority)
}
