package subjects

import (
	"fmt"
	"strconv"
	"strings"
)

// The agent registry lives in two JetStream KeyValue buckets. The registry
// bucket holds each agent's card and group memberships, and the outage
// records of escalations:
//
//	card.<agent>      the agent's card: what it is and what it accepts
//	installation      written by the operator in every shard's registry
//	                  of an installation split into shards: its number
//	                  of shards, which every process must use
//	                  ([InstallationKey])
//
// The presence bucket holds one key per agent:
//
//	presence.<agent>  its presence: written with every heartbeat, with a
//	                  per-key TTL, so the server itself removes it (and
//	                  leaves a delete marker) when the heartbeats stop
//
// Presence has a bucket of its own because subject delete markers need a
// stream that allows rollups (nats-server turns them on), and an agent
// that may write one key of such a bucket may purge all of it with one
// "Nats-Rollup: all" header. The registry bucket allows none, so no agent
// can wipe the cards and groups; the presence it could wipe comes back
// with the next heartbeats (docs/security.md).
//
// <agent> is the agent's key token, as in the status keys ('%' written
// '='), so server permissions can limit an agent to its own two keys
// (see [Scheme.AgentPermissions]).
const (
	registryBucketSuffix = "_AGENTS"
	presenceBucketSuffix = "_PRESENCE"
	cardKeyPrefix        = "card."
	presenceKeyPrefix    = "presence."
)

// RegistryBucket returns the name of the KeyValue bucket of the agent
// registry of s: [Scheme.Stream] followed by "_AGENTS", such as
// "AGENTBUS_AGENTS". Its stream is "KV_" and the name.
func (s Scheme) RegistryBucket() string {
	return s.Stream() + registryBucketSuffix
}

// RegistrySubjectPrefix returns the subject prefix of the registry's keys:
// "$KV.<bucket>.", followed by a key.
func (s Scheme) RegistrySubjectPrefix() string {
	return kvSubjectPrefix(s.RegistryBucket())
}

// RegistryDirectGetPrefix returns the prefix of the JetStream API subject
// that reads the last record of one registry key directly:
// "$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.", followed by the key.
func (s Scheme) RegistryDirectGetPrefix() string {
	return kvDirectGetPrefix(s.RegistryBucket())
}

// PresenceBucket returns the name of the KeyValue bucket of the agents'
// presence records of s: [Scheme.Stream] followed by "_PRESENCE", such as
// "AGENTBUS_PRESENCE". Its stream is "KV_" and the name.
func (s Scheme) PresenceBucket() string {
	return s.Stream() + presenceBucketSuffix
}

// PresenceSubjectPrefix returns the subject prefix of the presence
// bucket's keys: "$KV.<bucket>.", followed by a key ([PresenceKey]).
func (s Scheme) PresenceSubjectPrefix() string {
	return kvSubjectPrefix(s.PresenceBucket())
}

// PresenceDirectGetPrefix returns the prefix of the JetStream API subject
// that reads one agent's presence record directly:
// "$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.", followed by the key.
func (s Scheme) PresenceDirectGetPrefix() string {
	return kvDirectGetPrefix(s.PresenceBucket())
}

// kvSubjectPrefix is the subject prefix of bucket's keys.
func kvSubjectPrefix(bucket string) string { return kvPrefix + bucket + "." }

// kvDirectGetPrefix is the prefix of the subject that reads one of
// bucket's keys directly.
func kvDirectGetPrefix(bucket string) string {
	return jsDirectGet + kvStreamPrefix + bucket + "." + kvSubjectPrefix(bucket)
}

// CardKey returns the registry key of agent's card, "card.<agent>". The
// error wraps [ErrInvalidAgentID].
func CardKey(agent string) (string, error) {
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	return cardKeyPrefix + keyToken(agent), nil
}

// PresenceKey returns the key of agent's presence in the presence bucket
// ([Scheme.PresenceBucket]), "presence.<agent>". The error wraps [ErrInvalidAgentID].
func PresenceKey(agent string) (string, error) {
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	return presenceKeyPrefix + keyToken(agent), nil
}

// ProcessesSubject returns the subject on which every running process of
// agent that registered it (bus.Bus.Register) answers a request,
// "<root>.processes.<agent>". A process that closes asks it whether
// another process of the agent is still there, whose heartbeats keep the
// agent online, before it reports the agent offline. No stream takes it
// in. The error wraps [ErrInvalidAgentID].
func (s Scheme) ProcessesSubject(agent string) (string, error) {
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	return s.Root() + "." + kindProcesses + "." + EncodeToken(agent), nil
}

// OutageKey returns the registry key that records the escalation (kind
// "escalated") or the recovery (kind "recovered") of agent's outage that
// began at since, a Unix time in nanoseconds: "<kind>.<agent>.<since>".
// Whoever creates it first sends the event; everyone else finds it taken.
// The error wraps [ErrInvalidAgentID].
func OutageKey(kind, agent string, since int64) (string, error) {
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	if kind != "escalated" && kind != "recovered" {
		return "", fmt.Errorf("%w: outage key kind %q", ErrInvalidToken, kind)
	}
	return kind + "." + keyToken(agent) + "." + strconv.FormatInt(since, 10), nil
}

// InstallationKey is the registry key the operator writes when it
// provisions an installation split into shards ([ShardRoot]), in each
// shard's registry: the installation's number of shards, which every
// process must use. Agents may read it and not write it.
const InstallationKey = "installation"

// CardKeys and PresenceKeys are the key filters of every agent's card and
// presence.
const (
	CardKeys     = cardKeyPrefix + tail
	PresenceKeys = presenceKeyPrefix + tail
)

// RegistryKind is what a registry key holds.
type RegistryKind int

// The kinds of registry keys.
const (
	RegistryCard RegistryKind = iota + 1
	RegistryPresence
)

// ParseRegistryKey returns what key holds and whose it is: the inverse of
// CardKey and PresenceKey. Any other key is an error wrapping
// [ErrInvalidToken] (and [ErrInvalidAgentID] when the agent is at fault).
func ParseRegistryKey(key string) (RegistryKind, string, error) {
	var kind RegistryKind
	var tok string
	switch {
	case strings.HasPrefix(key, cardKeyPrefix):
		kind, tok = RegistryCard, key[len(cardKeyPrefix):]
	case strings.HasPrefix(key, presenceKeyPrefix):
		kind, tok = RegistryPresence, key[len(presenceKeyPrefix):]
	default:
		return 0, "", fmt.Errorf("%w: %q is not a registry key card.<agent> or presence.<agent>", ErrInvalidToken, key)
	}
	agent, err := decodeID("agent", fromKeyToken(tok))
	if err != nil {
		return 0, "", err
	}
	if keyToken(agent) != tok {
		return 0, "", fmt.Errorf("%w: registry key %q is not canonical", ErrInvalidToken, key)
	}
	return kind, agent, nil
}

// Group membership lives in the registry bucket too, one key per member:
//
//	group.<group>.<agent>   agent is a member of group
//
// A group's members are the keys under group.<group>; joining writes one,
// leaving deletes it, and the key's history is the group's changes. An
// agent may write only the keys that name it as the member (it joins and
// leaves itself); an operator may write any. Group names follow the rules
// of agent IDs ([ValidateID]).
const groupKeyPrefix = "group."

// GroupKeys is the key filter of every group's members.
const GroupKeys = groupKeyPrefix + tail

// GroupKey returns the registry key of agent's membership of group,
// "group.<group>.<agent>". The error wraps [ErrInvalidAgentID].
func GroupKey(group, agent string) (string, error) {
	if err := validateID("group", group); err != nil {
		return "", err
	}
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	return groupKeyPrefix + keyToken(group) + "." + keyToken(agent), nil
}

// GroupMemberKeys returns the key filter of group's members,
// "group.<group>.*". The error wraps [ErrInvalidAgentID].
func GroupMemberKeys(group string) (string, error) {
	if err := validateID("group", group); err != nil {
		return "", err
	}
	return groupKeyPrefix + keyToken(group) + "." + anyToken, nil
}

// ParseGroupKey returns the group and the member a key GroupKey made
// names. Any other key is an error wrapping [ErrInvalidToken].
func ParseGroupKey(key string) (group, agent string, err error) {
	rest, ok := strings.CutPrefix(key, groupKeyPrefix)
	gtok, atok, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return "", "", fmt.Errorf("%w: %q is not a group key group.<group>.<agent>", ErrInvalidToken, key)
	}
	if group, err = decodeID("group", fromKeyToken(gtok)); err != nil {
		return "", "", err
	}
	if agent, err = decodeID("agent", fromKeyToken(atok)); err != nil {
		return "", "", err
	}
	if keyToken(group) != gtok || keyToken(agent) != atok {
		return "", "", fmt.Errorf("%w: group key %q is not canonical", ErrInvalidToken, key)
	}
	return group, agent, nil
}
