package subjects

import (
	"fmt"
	"strings"
)

// Scheduled messages live in a stream of their own until they fire:
//
//	schedule: <root>.sched.<from>.<id>
//	fired:    <root>.fired.<id>.<direct or broadcast subject without its root>
//
// and, for a direct message, the schedule stream republishes the fired
// copy's headers (no body) on
//
//	firing:   <root>.firing.agent.<to>.p<N>.<rest of the fired subject>
//
// for its recipient's subscriber to hear that a consumer of that priority
// is due: a message the stream sources is stored without being published,
// so nobody hears it on the direct subject.
//
// A schedule is a message with the server's Nats-Schedule headers, stored
// under its sender and its message ID (the [StatusKey] form of the ID). When
// it fires, the server stores its content on its target, a fired subject of
// the same stream, and the message stream sources the fired subjects,
// dropping "fired.<id>" from them: the message reaches its recipient on the
// ordinary direct or broadcast subject. The fired copy keeps the server's
// Nats-Scheduler header, the schedule's subject, by which a receiver checks
// that whoever scheduled it is the sender the subject names.
const (
	kindSchedule = "sched"  // token after the root in a schedule subject
	kindFired    = "fired"  // token after the root in a fired subject
	kindFiring   = "firing" // token after the root in a firing notice
	schedSuffix  = "_SCHED" // schedule stream: <STREAM>_SCHED
)

// ScheduleStream returns the name of the stream that holds scheduled
// messages until they fire: [Scheme.Stream] followed by "_SCHED".
func (s Scheme) ScheduleStream() string {
	return s.Stream() + schedSuffix
}

// ScheduleSubjects returns the subjects of [Scheme.ScheduleStream]: every
// schedule subject, <root>.sched.*.*, and the fired form of every subject of
// [Scheme.StreamSubjects], <root>.fired.*.agent.*.p<N>.*.* and
// <root>.fired.*.all.p<N>.*.*.
func (s Scheme) ScheduleSubjects() []string {
	root := s.Root()
	out := []string{root + "." + kindSchedule + "." + anyToken + "." + anyToken}
	for _, subj := range s.StreamSubjects() {
		out = append(out, root+"."+kindFired+"."+anyToken+subj[len(root):])
	}
	return out
}

// Schedule returns the subject of the schedule of message id from agent
// from: <root>.sched.<from>.<id>. The error wraps [ErrInvalidAgentID] or
// [ErrInvalidToken].
func (s Scheme) Schedule(from, id string) (string, error) {
	if err := validateID("sender", from); err != nil {
		return "", err
	}
	if id == "" {
		return "", fmt.Errorf("%w: empty message ID", ErrInvalidToken)
	}
	return s.Root() + "." + kindSchedule + "." + EncodeToken(from) + "." + IDToken(id), nil
}

// Fired returns the subject a schedule of message id fires to, for the
// message's direct or broadcast subject: <root>.fired.<id>.<subject without
// its root>. The error wraps [ErrInvalidSubject] when subject is not a
// direct or broadcast subject of s, or [ErrInvalidToken] for an empty id.
func (s Scheme) Fired(id, subject string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("%w: empty message ID", ErrInvalidToken)
	}
	if k, _ := s.Route(subject); k == 0 {
		return "", fmt.Errorf("%w: %q is not a direct or broadcast subject under %q", ErrInvalidSubject, subject, s.Root())
	}
	root := s.Root()
	return root + "." + kindFired + "." + IDToken(id) + subject[len(root):], nil
}

// ScheduleSourceTransforms returns the source filter and destination pairs
// with which the message stream takes in fired messages from the schedule
// stream: <root>.fired.*.agent.*.*.*.* (and its indexed form,
// <root>.fired.*.agent.*.*.*.*.*.*) to <root>.agent.<...> and
// <root>.fired.*.all.*.*.* to <root>.all.<...>, dropping the fired token and
// the message ID.
func (s Scheme) ScheduleSourceTransforms() [][2]string {
	root := s.Root()
	fired := root + "." + kindFired + "." + anyToken + "."
	return [][2]string{
		{fired + kindAgent + ".*.*.*.*", root + "." + kindAgent + ".{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}.{{wildcard(5)}}"},
		{fired + kindAgent + ".*.*.*.*.*.*", root + "." + kindAgent + ".{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}.{{wildcard(5)}}.{{wildcard(6)}}.{{wildcard(7)}}"},
		{fired + kindAll + ".*.*.*", root + "." + kindAll + ".{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}"},
	}
}

// ParseSchedule returns the sender and the message ID token of a schedule
// subject, as the server's Nats-Scheduler header names it on a fired
// message. Compare the token with [IDToken]. The error wraps
// [ErrInvalidSubject] or [ErrInvalidAgentID].
func (s Scheme) ParseSchedule(subject string) (from, idToken string, err error) {
	prefix := s.Root() + "." + kindSchedule + "."
	rest, ok := strings.CutPrefix(subject, prefix)
	fromTok, idTok, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || idTok == "" || strings.Contains(idTok, ".") {
		return "", "", fmt.Errorf("%w: %q is not a schedule subject %s<from>.<id>", ErrInvalidSubject, subject, prefix)
	}
	if from, err = decodeID("sender", fromTok); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrInvalidSubject, err)
	}
	return from, idTok, nil
}

// SchedulePermissions returns what agent may publish, besides
// [Scheme.AgentPermissions], to schedule its own messages: its schedule
// subjects, <root>.sched.<agent>.*. They are not part of an agent's
// permissions by default: a stream that allows message schedules must allow
// rollups, so an agent that may publish to it can purge it whole with one
// "Nats-Rollup: all" header (docs/security.md). Grant them to agents you
// trust with every agent's schedules. The error wraps [ErrInvalidAgentID].
func (s Scheme) SchedulePermissions(agent string) ([]string, error) {
	if err := ValidateID(agent); err != nil {
		return nil, err
	}
	return []string{s.Root() + "." + kindSchedule + "." + EncodeToken(agent) + "." + anyToken}, nil
}

// FiringRePublish returns the source and destination of the schedule
// stream's republishing of fired direct messages, headers only, as firing
// notices: <root>.fired.*.agent.*.*.> to
// <root>.firing.agent.{{wildcard(2)}}.{{wildcard(3)}}.> (the recipient and
// the priority first).
func (s Scheme) FiringRePublish() (source, destination string) {
	root := s.Root()
	return root + "." + kindFired + "." + anyToken + "." + kindAgent + "." + anyToken + "." + anyToken + "." + tail,
		root + "." + kindFiring + "." + kindAgent + ".{{wildcard(2)}}.{{wildcard(3)}}." + tail
}

// FiringFilter returns the filter of the firing notices of the messages
// scheduled to agent: <root>.firing.agent.<token>.>. The error wraps
// [ErrInvalidAgentID].
func (s Scheme) FiringFilter(agent string) (string, error) {
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	return s.Root() + "." + kindFiring + "." + kindAgent + "." + EncodeToken(agent) + "." + tail, nil
}

// FiringPriority returns the priority of the fired message a firing notice
// of s announces, reading only its priority token, or 0 if subject is not
// a firing notice of s.
func (s Scheme) FiringPriority(subject string) int {
	prefix := s.Root() + "." + kindFiring + "."
	if !strings.HasPrefix(subject, prefix) {
		return 0
	}
	// What follows the firing token is a direct subject without its root.
	return s.PriorityOf(s.Root() + "." + subject[len(prefix):])
}
