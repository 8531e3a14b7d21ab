package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/subjects"
)

// ExtGroup is the CloudEvents extension that names the group a message
// was sent to (Bus.PublishGroup); each member gets its own copy.
const ExtGroup = "group"

// ErrNoMembers is returned by PublishGroup and Gather for a group without
// members.
var ErrNoMembers = errors.New("bus: group has no members")

// groupRecord is the value of a membership key (subjects.GroupKey).
type groupRecord struct {
	Since time.Time `json:"since"`
	By    string    `json:"by"` // the agent that joined, or "agentbus" for an operator
}

// GroupChange is an agent joining or leaving a group.
type GroupChange struct {
	Group  string
	Agent  string
	Joined bool      // false: left
	At     time.Time // when, by the server's clock
	By     string    // who changed it: the agent, or "agentbus" for an operator ("" when it left)
}

// JoinGroup makes the bus's agent a member of group: from now on, messages
// to the group (PublishGroup, Gather) reach its inbox; earlier ones do
// not. Membership is kept in the registry bucket until the agent leaves;
// joining again changes nothing. Group names follow the rules of agent
// IDs.
func (b *Bus) JoinGroup(ctx context.Context, group string) error {
	return b.setMember(ctx, group, b.agent, true, b.agent)
}

// LeaveGroup ends the bus's agent's membership of group.
func (b *Bus) LeaveGroup(ctx context.Context, group string) error {
	return b.setMember(ctx, group, b.agent, false, b.agent)
}

// AddToGroup makes agents members of group, as an operator. An invalid
// group or agent ID is refused (ErrInvalidAgentID) before any is added.
func (a *Admin) AddToGroup(ctx context.Context, group string, agents ...string) error {
	if err := validMembers(group, agents); err != nil {
		return err
	}
	for _, agent := range agents {
		if err := a.setMember(ctx, group, agent, true, operatorSender); err != nil {
			return err
		}
	}
	return nil
}

// RemoveFromGroup ends agents' membership of group, as an operator. An
// invalid group or agent ID is refused (ErrInvalidAgentID) before any is
// removed.
func (a *Admin) RemoveFromGroup(ctx context.Context, group string, agents ...string) error {
	if err := validMembers(group, agents); err != nil {
		return err
	}
	for _, agent := range agents {
		if err := a.setMember(ctx, group, agent, false, operatorSender); err != nil {
			return err
		}
	}
	return nil
}

// validMembers checks group and agents before an operator's change
// writes any membership: one invalid ID left a change half made, and an
// invalid group without agents was not refused at all.
func validMembers(group string, agents []string) error {
	if _, err := subjects.GroupMemberKeys(group); err != nil {
		return err
	}
	for _, agent := range agents {
		if _, err := subjects.GroupKey(group, agent); err != nil {
			return err
		}
	}
	return nil
}

// setMemberAttempts bounds how often setMember reads a membership key
// again that another writer changed between its read and its write.
const setMemberAttempts = 10

// setMember writes (join) or deletes agent's membership key of group,
// unless it says so already: a member joining again, or one not a member
// leaving, changes nothing (no write, no change to a watcher). The write
// expects the key as it was read, so that one made meanwhile is read
// again.
func (c *client) setMember(ctx context.Context, group, agent string, join bool, by string) error {
	if c.isClosed() {
		return ErrClosed
	}
	key, err := subjects.GroupKey(group, agent)
	if err != nil {
		return err
	}
	verb := "join"
	if !join {
		verb = "leave"
	}
	fail := func(err error) error {
		return c.closedBy(refusedCall(ctx, fmt.Errorf("%s group %s as %s: %w", verb, group, agent, c.registryMissing(c.registry, err))))
	}
	m := &nats.Msg{Subject: c.registry.prefix + key, Header: nats.Header{}}
	if join {
		if m.Data, err = json.Marshal(groupRecord{Since: time.Now().UTC(), By: by}); err != nil {
			return err
		}
	} else {
		m.Header.Set("KV-Operation", "DEL")
	}
	ctx, stop := c.watchRefusals(ctx, m.Subject)
	defer stop()
	for attempt := 1; ; attempt++ {
		last, err := c.getKey(ctx, c.registry, key)
		if err != nil {
			return fail(err)
		}
		member := last != nil && last.Header.Get("KV-Operation") == ""
		if member == join {
			return nil
		}
		seq := "0"
		if last != nil {
			seq = last.Header.Get(jetstream.SequenceHeader)
		}
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, seq)
		_, err = publishAgain(ctx, c.js, m)
		if isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequence) && attempt < setMemberAttempts {
			continue // changed meanwhile (or this write, its ack lost): read again
		}
		if err != nil {
			return fail(err)
		}
		return nil
	}
}

// GroupMembers returns the members of group, sorted; none for a group
// nobody joined.
func (c *client) GroupMembers(ctx context.Context, group string) ([]string, error) {
	filter, err := subjects.GroupMemberKeys(group)
	if err != nil {
		return nil, err
	}
	groups, err := c.readGroups(ctx, filter)
	return groups[group], err
}

// Groups returns every group with members, and its members, sorted.
func (c *client) Groups(ctx context.Context) (map[string][]string, error) {
	return c.readGroups(ctx, subjects.GroupKeys)
}

// readGroups reads the membership keys matching filter.
func (c *client) readGroups(ctx context.Context, filter string) (map[string][]string, error) {
	if c.shards != nil {
		return c.shards.readGroups(ctx, filter)
	}
	return c.readGroupsHere(ctx, filter)
}

// readGroupsHere is readGroups on this handle's own root.
func (c *client) readGroupsHere(ctx context.Context, filter string) (map[string][]string, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := c.watchRefusals(ctx, "$JS.API.")
	defer stop()
	cfg := jetstream.ConsumerConfig{FilterSubject: c.registry.prefix + filter, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy}
	out := map[string][]string{}
	err := c.reads.readStream(ctx, c.registry.stream, cfg, func(m jetstream.Msg, _ *jetstream.MsgMetadata) (bool, error) {
		ch, ok := groupChangeOf(c.registry.prefix, m)
		if ok && ch.Joined {
			out[ch.Group] = append(out[ch.Group], ch.Agent)
		}
		return false, nil
	})
	if err != nil {
		return nil, refusedCall(ctx, fmt.Errorf("read groups: %w", c.registryMissing(c.registry, err)))
	}
	for _, members := range out {
		slices.Sort(members)
	}
	return out, nil
}

// WatchGroups calls f with every membership of group ("" for every group)
// as it stands (the members, not those who left before) and then with
// every change, in order, until ctx ends (it
// returns nil then, but for a deadline that passed before the watch could
// start) or the handle closes (ErrClosed). f runs on the
// watch's goroutine. The Bus of a Shards watches every shard's registry:
// each membership's changes come in order, and f is never called twice at
// once.
func (c *client) WatchGroups(ctx context.Context, group string, f func(GroupChange)) error {
	if f == nil {
		return fmt.Errorf("%w: nil function to call with each change", ErrInvalidOption)
	}
	if c.shards != nil {
		return watchEvery(ctx, c.shards, f, func(ctx context.Context, b *Bus, f func(GroupChange)) error {
			return b.watchGroupsHere(ctx, group, f)
		})
	}
	return c.watchGroupsHere(ctx, group, f)
}

// watchGroupsHere is WatchGroups on this handle's own root.
func (c *client) watchGroupsHere(ctx context.Context, group string, f func(GroupChange)) error {
	if c.isClosed() {
		return ErrClosed
	}
	ctx, stopWatch := c.whileOpen(ctx)
	defer stopWatch()
	filter := subjects.GroupKeys
	if group != "" {
		var err error
		if filter, err = subjects.GroupMemberKeys(group); err != nil {
			return err
		}
	}
	cons, err := refusable(ctx, c, func(ctx context.Context) (jetstream.Consumer, error) {
		return c.js.OrderedConsumer(ctx, c.registry.stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{c.registry.prefix + filter},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
	})
	if err != nil {
		return c.watchNotStarted(ctx, fmt.Errorf("watch groups: %w", c.registryMissing(c.registry, err)))
	}
	it, err := cons.Messages()
	if err != nil {
		return c.watchNotStarted(ctx, fmt.Errorf("watch groups: %w", err))
	}
	// Stopped when ctx ends, and each Next ends with ctx too: a Stop
	// while the ordered consumer resets (after a reconnect) stops the old
	// subscription, not the one the reset then makes, and Next waited on
	// that one for good (nats.go 1.55). That subscription's two goroutines
	// are still left behind then, out of reach: nats.go's to fix.
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	// The memberships as they stand come first, the last message of each
	// key: a delete marker there is a member who left before the watch,
	// however long ago, and no news (before 2026-11-28 every watcher was
	// told each one). The first message with none pending after it ends
	// them. Were there none at all, the first change is a live one: a
	// leave then, of a key whose join the watch never saw, is no news
	// either.
	standing := true
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return c.watchFailed(ctx, fmt.Errorf("watch groups: %w", err))
		}
		if ch, ok := groupChangeOf(c.registry.prefix, m); ok && (ch.Joined || !standing) {
			f(ch)
		}
		if md, err := m.Metadata(); err != nil || md.NumPending == 0 {
			standing = false
		}
	}
}

// groupChangeOf reads a membership key's message: a join, or a leave (a
// delete).
func groupChangeOf(prefix string, m jetstream.Msg) (GroupChange, bool) {
	group, agent, err := subjects.ParseGroupKey(strings.TrimPrefix(m.Subject(), prefix))
	if err != nil {
		return GroupChange{}, false
	}
	ch := GroupChange{Group: group, Agent: agent}
	if md, err := m.Metadata(); err == nil {
		ch.At = md.Timestamp
	}
	if op := m.Headers().Get("KV-Operation"); op != "" {
		return ch, true // left
	}
	var r groupRecord
	if json.Unmarshal(m.Data(), &r) != nil {
		return GroupChange{}, false
	}
	ch.Joined, ch.By = true, r.By
	return ch, true
}

// GroupAck is what PublishGroup did for one member.
type GroupAck struct {
	Member string
	PubAck       // the member's copy, when it was stored
	Err    error // why it was not
}

// PublishGroup sends m to every member of group: each gets its own copy in
// its own inbox, at m's priority, so a member that is offline finds it
// when it comes back, and one that joins later does not get it. The copies
// share m's conversation (CorrelationID, m's ID unless set), carry the
// group's name (ExtGroup), and each has an ID derived from m's and the
// member's, so sending m again stores no copy twice. The sender itself is
// skipped if it is a member. It returns one GroupAck per member, and an
// error when any copy failed (errors.Join of them), or ErrNoMembers.
func (b *Bus) PublishGroup(ctx context.Context, group string, m Message) ([]GroupAck, error) {
	members, err := b.GroupMembers(ctx, group)
	if err != nil {
		return nil, err
	}
	members = slices.DeleteFunc(members, func(a string) bool { return a == b.agent })
	if len(members) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoMembers, group)
	}
	inherit(ctx, &m)
	m.SetDefaults(time.Now())
	setExtension(&m, ExtGroup, group)
	return b.publishCopies(ctx, m, members)
}

// publishCopies sends m to each of members, as PublishGroup describes,
// asynchronously, and waits for every copy. A copy whose ack a dropped
// connection lost (nats.ErrDisconnected: it may be stored) is sent again,
// as Publish sends, with its ID, which the stream stores once.
func (b *Bus) publishCopies(ctx context.Context, m Message, members []string) ([]GroupAck, error) {
	acks := make([]GroupAck, len(members))
	copies := make([]Message, len(members))
	futures := make([]*PublishFuture, len(members))
	var errs []error
	for i, member := range members {
		copies[i] = copyFor(m, member)
		acks[i].Member = member
		f, err := b.PublishAsync(ctx, copies[i])
		if err != nil {
			acks[i].Err = err
			errs = append(errs, fmt.Errorf("member %q: %w", member, err))
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		ack, err := f.Wait(ctx)
		if errors.Is(err, nats.ErrDisconnected) {
			ack, err = b.Publish(ctx, copies[i])
		}
		acks[i].PubAck, acks[i].Err = ack, err
		if err != nil {
			errs = append(errs, fmt.Errorf("member %q: %w", acks[i].Member, err))
		}
	}
	return acks, errors.Join(errs...)
}

// copyFor returns m's copy for member: addressed to it, with an ID derived
// from m's and the member's.
func copyFor(m Message, member string) Message {
	c := m
	c.To = member
	c.ID = uuid.NewSHA1(copySpace, []byte(m.ID+"\x00"+member)).String()
	return c
}

// copySpace names the IDs of the copies of one message to many agents.
var copySpace = uuid.MustParse("3b8d6c7e-4f0a-4d7e-9a55-8e2c1f6b9d40")
