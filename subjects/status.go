package subjects

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// The message lifecycle status lives in a JetStream KeyValue bucket, one key
// per message and recipient:
//
//	<conversation>.<id>.<from>.<to>
//
// <conversation> is [ConversationKey] of the message's correlation ID, so the
// keys of one conversation share a literal prefix and a timeline is read
// without scanning the bucket. <id>, <from> and <to> are [EncodeToken] tokens
// with '%' written '=' (KeyValue keys allow [-/_=.A-Za-z0-9] only; '='
// itself is escaped as "=3D", so the mapping stays one to one). <to> is the
// recipient; a broadcast has one key for the sender with <to> "=2A" (the
// encoded [Broadcast]) and one per recipient that received it. Because the
// sender and the recipient are tokens of their own, server permissions can
// limit an agent to the keys that name it (see [Scheme.StatusKeyPatterns]).
const (
	statusBucketSuffix = "_STATUS"
	keyEscape          = '='
	// maxKeyIDLen bounds the encoded message ID in a key; a longer ID is
	// written as hashedIDPrefix and the hex SHA-256 of the ID. "=H" cannot
	// come from encoding, where '=' is followed by two hex digits.
	maxKeyIDLen    = 200
	hashedIDPrefix = "=H"
)

// StatusBucket returns the name of the KeyValue bucket that holds the
// lifecycle status of the messages of s: [Scheme.Stream] followed by
// "_STATUS", such as "AGENTBUS_STATUS". Its stream is "KV_" and the name.
func (s Scheme) StatusBucket() string {
	return s.Stream() + statusBucketSuffix
}

// StatusSubjectPrefix returns the subject prefix of the status records of
// s: "$KV.<bucket>.", followed by a key (StatusKey).
func (s Scheme) StatusSubjectPrefix() string {
	return kvSubjectPrefix(s.StatusBucket())
}

// StatusDirectGetPrefix returns the prefix of the JetStream API subject
// that reads the last record of one key directly:
// "$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.", followed by the key. An
// agent's permissions allow it for the keys that name it.
func (s Scheme) StatusDirectGetPrefix() string {
	return kvDirectGetPrefix(s.StatusBucket())
}

// ConversationKey returns the key token of the conversation that
// correlationID names: the first 16 bytes of its SHA-256 in lower-case hex,
// 32 characters. It is the hex form of the trace ID that package bus gives
// the conversation (bus.ConversationTraceID), so a trace ID found in a
// tracing backend leads straight to the conversation's status keys.
func ConversationKey(correlationID string) string {
	sum := conversationSum(correlationID)
	return hex.EncodeToString(sum[:conversationKeyBytes])
}

// conversationSum returns the SHA-256 of correlationID. The bytes are
// copied to the stack, not the heap, for an ID of up to 64 bytes (a UUID
// has 36): it runs for every direct message sent.
func conversationSum(correlationID string) [sha256.Size]byte {
	var buf [64]byte
	return sha256.Sum256(append(buf[:0], correlationID...))
}

// conversationKeyBytes is how many bytes of the SHA-256 a conversation key
// keeps.
const conversationKeyBytes = 16

// StatusKey returns the status key of the message id from agent from to
// recipient to (an agent ID or [Broadcast]) in the conversation named by
// correlationID. from and to must pass [ValidateID] (to may be [Broadcast])
// and id must not be empty; the error wraps [ErrInvalidAgentID] or
// [ErrInvalidToken].
func StatusKey(correlationID, id, from, to string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("%w: empty message ID", ErrInvalidToken)
	}
	if err := validateID("sender", from); err != nil {
		return "", err
	}
	if to != Broadcast {
		if err := validateID("recipient", to); err != nil {
			return "", err
		}
	}
	return ConversationKey(correlationID) + "." + IDToken(id) + "." + keyToken(from) + "." + keyToken(to), nil
}

// StatusKeysOfConversation returns the key filter that matches every status
// key of the conversation named by correlationID: "<conversation>.>".
func StatusKeysOfConversation(correlationID string) string {
	return ConversationKey(correlationID) + "." + tail
}

// StatusKeysOfAgentInConversation returns the two key filters that match
// the status keys of the conversation named by correlationID that name
// agent, as the sender ("<conversation>.*.<agent>.*") and as the recipient
// ("<conversation>.*.*.<agent>"): the messages agent sent or received in
// it. Both lie within [StatusKeyPatterns] of agent. The error wraps
// [ErrInvalidAgentID].
func StatusKeysOfAgentInConversation(correlationID, agent string) ([]string, error) {
	if err := ValidateID(agent); err != nil {
		return nil, err
	}
	c, a := ConversationKey(correlationID), keyToken(agent)
	return []string{c + ".*." + a + ".*", c + ".*.*." + a}, nil
}

// StatusKeysOfMessage returns the key filter that matches every status key
// of message id, whatever its conversation: "*.<id>.*.*". The leading
// wildcard makes the server look through the bucket's keys; prefer
// StatusKey when the correlation ID is known.
func StatusKeysOfMessage(id string) string {
	return "*." + IDToken(id) + ".*.*"
}

// StatusKeyPatterns returns the two key patterns that match the status keys
// naming agent: as the sender ("*.*.<agent>.*") and as the recipient
// ("*.*.*.<agent>"). They are what an agent's permissions allow it to read and
// write. The error wraps [ErrInvalidAgentID].
func StatusKeyPatterns(agent string) ([]string, error) {
	return agentKeys("*", agent)
}

// StatusKeysOfAgent returns the two key filters that match the status keys
// of message id that name agent, as the sender ("*.<id>.<agent>.*") and as
// the recipient ("*.<id>.*.<agent>"). Both lie within [StatusKeyPatterns]
// of agent. The error wraps [ErrInvalidAgentID].
func StatusKeysOfAgent(id, agent string) ([]string, error) {
	return agentKeys(IDToken(id), agent)
}

// agentKeys returns the sender and recipient key filters of agent for the
// ID token idTok.
func agentKeys(idTok, agent string) ([]string, error) {
	if err := ValidateID(agent); err != nil {
		return nil, err
	}
	a := keyToken(agent)
	return []string{"*." + idTok + "." + a + ".*", "*." + idTok + ".*." + a}, nil
}

// StatusKeyParts are the parts of a status key.
type StatusKeyParts struct {
	// Conversation is the ConversationKey of the message's correlation ID.
	Conversation string
	// ID is the message ID; for an ID longer than the key allows it is
	// empty and IDHash holds the key's hashed form.
	ID, IDHash string
	// From is the sender, To the recipient or Broadcast.
	From, To string
}

// ParseStatusKey splits a status key made by StatusKey. It accepts only
// the key StatusKey writes for the parts it returns: each token in its
// canonical form ('=' escapes, never '%'), the conversation in lower-case
// hex, and a hashed ID as "=H" and 64 lower-case hex digits. The error
// wraps [ErrInvalidToken] or [ErrInvalidAgentID].
func ParseStatusKey(key string) (StatusKeyParts, error) {
	parts := strings.Split(key, ".")
	if len(parts) != 4 || len(parts[0]) != 2*conversationKeyBytes || !isLowerHex(parts[0]) {
		return StatusKeyParts{}, fmt.Errorf("%w: %q is not a status key <conversation>.<id>.<from>.<to>", ErrInvalidToken, key)
	}
	p := StatusKeyParts{Conversation: parts[0]}
	var err error
	if h, ok := strings.CutPrefix(parts[1], hashedIDPrefix); ok {
		if len(h) != 2*sha256.Size || !isLowerHex(h) {
			return StatusKeyParts{}, fmt.Errorf("%w: hashed message ID token %q", ErrInvalidToken, parts[1])
		}
		p.IDHash = parts[1]
	} else if p.ID, err = DecodeToken(fromKeyToken(parts[1])); err != nil {
		return StatusKeyParts{}, err
	} else if IDToken(p.ID) != parts[1] {
		return StatusKeyParts{}, notCanonical("message ID", parts[1])
	}
	if p.From, err = decodeID("sender", fromKeyToken(parts[2])); err != nil {
		return StatusKeyParts{}, err
	} else if keyToken(p.From) != parts[2] {
		return StatusKeyParts{}, notCanonical("sender", parts[2])
	}
	if p.To, err = decodeRecipient(fromKeyToken(parts[3])); err != nil {
		return StatusKeyParts{}, err
	} else if keyToken(p.To) != parts[3] {
		return StatusKeyParts{}, notCanonical("recipient", parts[3])
	}
	return p, nil
}

// notCanonical reports a key token that decodes, but is not the token
// keyToken or IDToken writes for what it decodes to.
func notCanonical(role, tok string) error {
	return fmt.Errorf("%w: %s token %q is not in the form status keys write", ErrInvalidToken, role, tok)
}

// keyToken is EncodeToken(s) with the escape '%' written '='.
func keyToken(s string) string {
	return strings.ReplaceAll(EncodeToken(s), "%", string(keyEscape))
}

// fromKeyToken undoes keyToken's change of escape character.
func fromKeyToken(t string) string {
	return strings.ReplaceAll(t, string(keyEscape), "%")
}

// IDToken returns the token that stands for message id in status keys,
// indexed direct subjects ([Scheme.IndexedDirect]) and schedule subjects:
// [EncodeToken] of id with the escape '%' written '=' (status keys allow no
// '%'), or for an ID that so encodes to more than 200 bytes, "=H" and the
// hex SHA-256 of the ID. The mapping is one to one but for the hashed
// form.
func IDToken(id string) string {
	if n := encodedLen(id); n == len(id) && n <= maxKeyIDLen {
		return id // nothing to escape: a UUID, say
	} else if n <= maxKeyIDLen {
		return keyToken(id)
	}
	sum := sha256.Sum256([]byte(id))
	return hashedIDPrefix + hex.EncodeToString(sum[:])
}
