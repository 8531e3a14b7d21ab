package bus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// AgentCard describes an agent to the others: what it is, what it can do
// and what it accepts. Its fields follow the A2A AgentCard where they make
// sense on a bus. An agent publishes its own with Bus.Register; anyone
// reads them with Agents, LookupAgent and FindAgents.
type AgentCard struct {
	// Name is the agent ID. Register sets it to the bus's agent.
	Name string `json:"name"`
	// Description says what the agent is for, for people and planners.
	Description string `json:"description,omitempty"`
	// Version is the agent's own version.
	Version string `json:"version,omitempty"`
	// Skills are what the agent can do.
	Skills []Skill `json:"skills,omitempty"`
	// Profiles are the agent protocols (codec/profiles) it speaks.
	Profiles []string `json:"profiles,omitempty"`
	// Accepts are the message types it handles; empty means any.
	Accepts []string `json:"accepts,omitempty"`
	// Priorities are the priority levels it serves, 1..5; empty means all.
	Priorities []int `json:"priorities,omitempty"`
	// Heartbeat is how often the agent reports its presence; Register sets
	// it (WithHeartbeat).
	Heartbeat Duration `json:"heartbeat"`
	// Updated is when the card was written; Register sets it.
	Updated time.Time `json:"updated"`
}

// Skill is one thing an agent can do, as in A2A's AgentSkill.
type Skill struct {
	ID          string   `json:"id"`
	Name        string   `json:"name,omitempty"`
	Description string   `json:"description,omitempty"`
	Tags        []string `json:"tags,omitempty"`
	Examples    []string `json:"examples,omitempty"`
}

// Duration is a time.Duration that reads and writes itself in JSON as Go
// writes durations ("10s").
type Duration time.Duration

// MarshalJSON writes d as a string such as "10s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a string such as "10s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Limits of an agent card, which every agent may read: they bound what
// one agent makes the others load.
const (
	// MaxCardSize is the most bytes a card takes as JSON.
	MaxCardSize = 32 << 10
	// MaxCardText bounds the description, a skill's description and an
	// example, in bytes.
	MaxCardText = 4096
	// MaxCardItems bounds the skills, profiles, accepted types, a skill's
	// tags and its examples.
	MaxCardItems = 64
)

// ErrInvalidCard is wrapped by the error Register returns for a card that
// breaks the rules: an empty or over-long field, text that is not UTF-8,
// a control character in a name (an ID, a tag, a profile, a version), too
// many items, a priority outside 1..5, or more than MaxCardSize bytes in
// all.
var ErrInvalidCard = errors.New("bus: invalid agent card")

// validate checks c, whose Name is set. It stops at the first rule broken
// by a count, so that a card of a million skills is not checked item by
// item into an error of megabytes.
func (c *AgentCard) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidCard, fmt.Sprintf(format, args...))
	}
	// text checks free text (descriptions, examples): UTF-8, at most limit bytes.
	text := func(field, v string, limit int) error {
		switch {
		case len(v) > limit:
			return bad("%s is %d bytes, the limit is %d", field, len(v), limit)
		case !utf8.ValidString(v):
			return bad("%s is not UTF-8", field)
		}
		return nil
	}
	// name checks a name (an ID, a tag, a profile): text on one line, as
	// listings print it, and not empty when required.
	name := func(field, v string, required bool) error {
		if v == "" && required {
			return bad("%s is empty", field)
		}
		if err := text(field, v, codec.MaxIDLen); err != nil {
			return err
		}
		if i := strings.IndexFunc(v, unicode.IsControl); i >= 0 {
			return bad("%s %q has a control character", field, v)
		}
		return nil
	}
	for field, n := range map[string]int{"skills": len(c.Skills), "profiles": len(c.Profiles), "accepted types": len(c.Accepts)} {
		if n > MaxCardItems {
			return bad("%d %s, the limit is %d", n, field, MaxCardItems)
		}
	}
	for _, s := range c.Skills {
		if len(s.Tags) > MaxCardItems || len(s.Examples) > MaxCardItems {
			return bad("skill %q has %d tags and %d examples, the limit is %d each", s.ID, len(s.Tags), len(s.Examples), MaxCardItems)
		}
	}
	errs := []error{text("description", c.Description, MaxCardText), name("version", c.Version, false)}
	for i, s := range c.Skills {
		errs = append(errs, name(fmt.Sprintf("skill %d id", i), s.ID, true), name("skill name", s.Name, false),
			text("skill description", s.Description, MaxCardText))
		for _, t := range s.Tags {
			errs = append(errs, name("tag of skill "+s.ID, t, true))
		}
		for _, e := range s.Examples {
			errs = append(errs, text("example", e, MaxCardText))
		}
	}
	for _, p := range c.Profiles {
		errs = append(errs, name("profile", p, true))
	}
	for _, t := range c.Accepts {
		if err := subjects.ValidateType(t); err != nil {
			errs = append(errs, bad("accepted type %q: %v", t, err))
		}
	}
	for _, p := range c.Priorities {
		if subjects.ValidatePriority(p) != nil {
			errs = append(errs, bad("priority %d is not 1..5", p))
		}
	}
	return errors.Join(errs...)
}

// PresenceStatus is whether an agent is there.
type PresenceStatus string

// The presence statuses.
const (
	// Online: its heartbeats arrive.
	Online PresenceStatus = "online"
	// Offline: it shut down, or its heartbeats stopped for three intervals
	// (a crash, a lost network).
	Offline PresenceStatus = "offline"
	// Unknown: it never reported its presence, or the server no longer
	// remembers when it went (RegistryConfig.MarkerTTL).
	Unknown PresenceStatus = "unknown"
)

// Presence is an agent's presence as the registry tells it.
type Presence struct {
	Status PresenceStatus
	// Since is when it came online (Online) or was found gone (Offline).
	Since time.Time
	// LastSeen is its last heartbeat: exact after a clean shutdown and
	// while online, within one interval after its heartbeats stopped.
	LastSeen time.Time
	// Reason says why it is offline: ReasonShutdown or ReasonSilent.
	Reason string
}

// Why an agent is offline.
const (
	// ReasonShutdown: its bus closed cleanly.
	ReasonShutdown = "shutdown"
	// ReasonSilent: its heartbeats stopped; the server removed its
	// presence three intervals after the last one.
	ReasonSilent = "silent"
)

// AgentInfo is one agent of the registry: its card and its presence.
type AgentInfo struct {
	Card     AgentCard
	Presence Presence
}

// DefaultHeartbeat is how often a registered agent reports its presence
// (WithHeartbeat). An agent is found offline three intervals after its
// last heartbeat, 30 s, without any process watching: the server removes
// its presence record. Ten seconds keeps 10,000 agents at 1,000 small
// writes a second on the server and finds a crash well inside the
// pipeline protocol's 3 minutes; AGNTCY SLIM uses the same 10 s and 3
// misses.
const DefaultHeartbeat = 10 * time.Second

// presenceMisses is how many heartbeat intervals pass before the server
// removes an agent's presence.
const presenceMisses = 3

// presenceRecord is the value of a presence key: a structured CloudEvent
// (CloudEvents 1.0, JSON), of type agentbus.presence.online or
// agentbus.presence.offline.
type presenceRecord struct {
	SpecVersion     string       `json:"specversion"`
	ID              string       `json:"id"`
	Source          string       `json:"source"`
	Type            string       `json:"type"`
	Time            time.Time    `json:"time"`
	DataContentType string       `json:"datacontenttype"`
	Data            presenceData `json:"data"`
}

type presenceData struct {
	Agent    string         `json:"agent"`
	Status   PresenceStatus `json:"status"`
	Since    time.Time      `json:"since"`
	Interval Duration       `json:"interval"`
	Reason   string         `json:"reason,omitempty"`
}

// The CloudEvents types of presence records.
const (
	EventPresenceOnline  = "agentbus.presence.online"
	EventPresenceOffline = "agentbus.presence.offline"
)

// RegistryConfig returns the KeyValue bucket Provision creates for the
// agent registry: each agent's card and group memberships, and the
// records of escalated outages. It allows no rollups (Provision turns
// them off), so no agent that may write its own keys can purge the others.
func (c StreamConfig) RegistryConfig() (jetstream.KeyValueConfig, error) {
	return c.registryBucket(subjects.Scheme.RegistryBucket, "agentbus agent registry under %s: cards, groups and outages", 0)
}

// PresenceConfig returns the KeyValue bucket Provision creates for the
// agents' presence: one record per agent, written with a TTL (three
// heartbeats) and the server's delete markers kept for a day, so that an
// agent that went silent reads offline with when, and not unknown. The
// server requires a bucket with delete markers to allow rollups, which is
// why presence has a bucket of its own (docs/security.md).
func (c StreamConfig) PresenceConfig() (jetstream.KeyValueConfig, error) {
	return c.registryBucket(subjects.Scheme.PresenceBucket, "agentbus presence under %s", presenceMarkerTTL)
}

// registryBucket is a bucket of the registry under c's root, named by
// bucket and described by description (with the root for its %s): one
// record per key, kept as c's messages are stored and placed, with delete
// markers kept for markerTTL (none when 0).
func (c StreamConfig) registryBucket(bucket func(subjects.Scheme) string, description string, markerTTL time.Duration) (jetstream.KeyValueConfig, error) {
	cfg, err := c.JetStream()
	if err != nil {
		return jetstream.KeyValueConfig{}, err
	}
	s, _ := subjects.New(c.Root) // checked by JetStream
	return jetstream.KeyValueConfig{
		Bucket:         bucket(s),
		Description:    fmt.Sprintf(description, s.Root()),
		History:        1,
		Storage:        cfg.Storage,
		Replicas:       cfg.Replicas,
		Placement:      cfg.Placement,
		LimitMarkerTTL: markerTTL,
	}, nil
}

// presenceMarkerTTL is how long the presence bucket remembers that an
// agent went silent.
const presenceMarkerTTL = 24 * time.Hour

// kvSubjects are the subjects by which a handle reads and writes one
// KeyValue bucket.
type kvSubjects struct {
	prefix    string // "$KV.<bucket>."
	stream    string // "KV_<bucket>"
	directGet string // "$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.", then the key
}

func registrySubjects(s subjects.Scheme) kvSubjects {
	return kvSubjects{prefix: s.RegistrySubjectPrefix(), stream: "KV_" + s.RegistryBucket(), directGet: s.RegistryDirectGetPrefix()}
}

func presenceSubjects(s subjects.Scheme) kvSubjects {
	return kvSubjects{prefix: s.PresenceSubjectPrefix(), stream: "KV_" + s.PresenceBucket(), directGet: s.PresenceDirectGetPrefix()}
}

// presenceOf reads agent's presence record directly (one request): its
// presence and heartbeat interval. An agent that never reported one, or
// a presence bucket that does not exist, is Unknown.
func (c *client) presenceOf(ctx context.Context, agent string) (Presence, time.Duration, error) {
	p, interval, err := c.readPresence(ctx, agent)
	if errors.Is(err, nats.ErrNoResponders) {
		return Presence{Status: Unknown}, 0, nil // no presence bucket: nobody reports presence
	}
	if err != nil {
		return Presence{}, 0, fmt.Errorf("presence of %s: %w", agent, err)
	}
	return p, interval, nil
}

// readPresence is presenceOf, with the error of a missing bucket.
func (c *client) readPresence(ctx context.Context, agent string) (Presence, time.Duration, error) {
	key, err := subjects.PresenceKey(agent)
	if err != nil {
		return Presence{}, 0, err
	}
	resp, err := c.getKey(ctx, c.presence, key)
	if err != nil || resp == nil {
		return Presence{Status: Unknown}, 0, err
	}
	if resp.Header.Get(jetstream.MarkerReasonHeader) != "" || resp.Header.Get("KV-Operation") != "" {
		at, _ := time.Parse(time.RFC3339Nano, resp.Header.Get(jetstream.TimeStampHeaer))
		return Presence{Status: Offline, Since: at, Reason: ReasonSilent}, 0, nil
	}
	var r presenceRecord
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return Presence{Status: Unknown}, 0, nil
	}
	stored, _ := time.Parse(time.RFC3339Nano, resp.Header.Get(jetstream.TimeStampHeaer))
	return r.presence(stored), time.Duration(r.Data.Interval), nil
}

// presence is the Presence r records, stored by the server at stored. An
// agent offline since it closed is so since the server stored its record,
// by the server's clock, as a silent one is since the server's marker:
// the agent's own clock may run ahead or behind the watchers' that count
// an escalation's After from it (before 2026-11-28, an agent two minutes
// behind was escalated at once). Online, Since is the agent's.
func (r presenceRecord) presence(stored time.Time) Presence {
	p := Presence{Status: r.Data.Status, Since: r.Data.Since, LastSeen: r.Time, Reason: r.Data.Reason}
	if p.Status == Offline && !stored.IsZero() {
		p.Since = stored.UTC()
	}
	return p
}

// getKey reads the last record of key in kv directly (one request): nil,
// and no error, if the key has none.
func (c *client) getKey(ctx context.Context, kv kvSubjects, key string) (*nats.Msg, error) {
	return directGetKey(ctx, c.nc, c.reconnects, kv.directGet, key)
}

// directGetKey is getKey for a caller without a handle (provisioning),
// with the bucket's direct-get prefix.
func directGetKey(ctx context.Context, nc *nats.Conn, r *reconnects, prefix, key string) (*nats.Msg, error) {
	resp, err := directGet(ctx, nc, r, prefix+key)
	if err != nil {
		return nil, err
	}
	switch code := resp.Header.Get("Status"); code {
	case "":
		return resp, nil
	case "404":
		return nil, nil
	default:
		return nil, fmt.Errorf("key %s: server answered %s %s", key, code, resp.Header.Get("Description"))
	}
}

// presenceFresh is how long a Request trusts the presence it last read of
// an agent that was not offline then. Within it a loop of requests to one
// agent reads the registry once, which saves each request a round trip
// ahead of it (about 60 µs over TCP on loopback here). A request sent on
// such a reading looks again when the reading is presenceFresh old, so a
// request to an agent that went offline meanwhile fails within
// presenceFresh, as one waiting when the agent went does. An offline
// reading is never trusted later: the agent may be back.
const presenceFresh = 100 * time.Millisecond

// maxPresences bounds the readings a bus keeps; past it, the stale ones go.
const maxPresences = 4096

// presences are the presence readings a bus's Requests trust while they
// are fresh, by agent.
type presences struct {
	mu sync.Mutex
	m  map[string]presenceReading
}

// presenceReading is an agent's presence and heartbeat interval as read at
// a time.
type presenceReading struct {
	p        Presence
	interval time.Duration
	at       time.Time
}

// fresh returns the reading of agent taken less than presenceFresh before
// now, if there is one.
func (ps *presences) fresh(agent string, now time.Time) (presenceReading, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	r, ok := ps.m[agent]
	return r, ok && now.Sub(r.at) < presenceFresh
}

// note keeps reading r of agent, or forgets the agent's reading when r
// says offline.
func (ps *presences) note(agent string, r presenceReading) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if r.p.Status == Offline {
		delete(ps.m, agent)
		return
	}
	if ps.m == nil {
		ps.m = make(map[string]presenceReading)
	}
	if _, ok := ps.m[agent]; !ok && len(ps.m) >= maxPresences {
		for a, old := range ps.m {
			if r.at.Sub(old.at) >= presenceFresh {
				delete(ps.m, a)
			}
		}
		if len(ps.m) >= maxPresences {
			return
		}
	}
	ps.m[agent] = r
}

// requestPresence returns agent's presence for a Request: a fresh reading
// if the bus has one (cached reports true), else one read now. A reading
// that cannot be taken is the error.
func (b *Bus) requestPresence(ctx context.Context, agent string) (r presenceReading, cached bool, err error) {
	now := time.Now()
	if r, ok := b.presences.fresh(agent, now); ok {
		return r, true, nil
	}
	r, err = b.readPresence(ctx, agent, now)
	return r, false, err
}

// readPresence reads agent's presence as of now and notes it.
func (b *Bus) readPresence(ctx context.Context, agent string, now time.Time) (presenceReading, error) {
	p, interval, err := b.presenceOfAgent(ctx, agent)
	if err != nil {
		return presenceReading{}, err
	}
	if p.Reason == ReasonSilent {
		// When it was last seen depends on its heartbeat, which its card
		// says (agentInfo): a lookup, only for an agent gone silent, so
		// that its AgentOfflineError says it.
		if info, err := b.LookupAgent(ctx, agent); err == nil && info.Presence.Reason == ReasonSilent {
			p = info.Presence
		}
	}
	r := presenceReading{p: p, interval: interval, at: now}
	b.presences.note(agent, r)
	return r, nil
}

// presenceCheck times a waiting Request's looks at its recipient's
// presence: every heartbeat interval while the agent is online, and once
// when a cached reading the request was sent on stops being fresh. A nil
// *presenceCheck never fires.
type presenceCheck struct {
	t        *time.Timer
	interval time.Duration // of the last reading that gave one
}

// newPresenceCheck returns the check of a request sent on reading r, nil
// if there is nothing to check.
func newPresenceCheck(r presenceReading, cached bool) *presenceCheck {
	c := &presenceCheck{}
	if r.p.Status == Online {
		c.interval = r.interval
	}
	switch {
	case cached:
		c.t = time.NewTimer(time.Until(r.at.Add(presenceFresh)))
	case c.interval > 0:
		c.t = time.NewTimer(c.interval)
	default:
		return nil
	}
	return c
}

// C is the channel the next look is due on; nil for a nil check.
func (c *presenceCheck) C() <-chan time.Time {
	if c == nil {
		return nil
	}
	return c.t.C
}

// looked schedules the next look after one that found r (err nil), or
// could not (err): an interval later while the agent is online, or while
// the registry cannot tell after it was.
func (c *presenceCheck) looked(r presenceReading, err error) {
	if err == nil {
		c.interval = 0
		if r.p.Status == Online {
			c.interval = r.interval
		}
	}
	if c.interval > 0 {
		c.t.Reset(c.interval)
	}
}

// stop stops c's timer.
func (c *presenceCheck) stop() {
	if c != nil {
		c.t.Stop()
	}
}

// ErrAgentOffline is wrapped by the error of a Request to an agent the
// registry says is offline (an *AgentOfflineError), unless the request asks
// to wait for it (QueueIfOffline).
var ErrAgentOffline = errors.New("bus: agent offline")

// AgentOfflineError says which agent is offline, since when and why.
type AgentOfflineError struct {
	Agent    string
	Presence Presence
}

func (e *AgentOfflineError) Error() string {
	gone := "offline"
	if !e.Presence.Since.IsZero() {
		gone = "offline for " + max(time.Since(e.Presence.Since), 0).Round(time.Second).String() // a clock behind the server's: 0s, not negative
	}
	return fmt.Sprintf("%v: %s has been %s (%s)", ErrAgentOffline, e.Agent, gone, e.Presence.Reason)
}

func (e *AgentOfflineError) Unwrap() error { return ErrAgentOffline }

// Register publishes card as this agent's card and starts reporting the
// agent's presence: online at once, with a heartbeat every interval
// (WithHeartbeat, DefaultHeartbeat) until Close, which reports it offline
// (ReasonShutdown). A process that dies without Close is found offline
// (ReasonSilent) three intervals after its last heartbeat, by the server
// itself. card.Name, Heartbeat and Updated are set by Register. Calling it
// again replaces the card; the heartbeats go on. The card is the agent's,
// not the process's: of processes of one agent that register different
// cards, the last Register wins.
//
// Errors: ErrInvalidCard, ErrNotProvisioned (the registry bucket is
// missing: provision with this version), ErrClosed, or the server's.
func (b *Bus) Register(ctx context.Context, card AgentCard) error {
	if b.isClosed() {
		return ErrClosed
	}
	card.Name, card.Heartbeat, card.Updated = b.agent, Duration(b.opts.heartbeat), time.Now().UTC()
	if err := card.validate(); err != nil {
		return err
	}
	data, err := json.Marshal(card)
	if err != nil {
		return err
	}
	if len(data) > MaxCardSize {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidCard, len(data), MaxCardSize)
	}
	key, err := subjects.CardKey(b.agent)
	if err != nil {
		return err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if _, err := publishAgain(ctx, b.js, &nats.Msg{Subject: b.registry.prefix + key, Data: data}); err != nil {
		return b.closedBy(fmt.Errorf("register %s: %w", b.agent, b.registryMissing(b.registry, err)))
	}
	// The heartbeats are this call's from here: it holds no lock over the
	// network calls below, which every other call of the handle would wait
	// for, and a Register meanwhile only replaces the card.
	hb := &heartbeat{stop: make(chan struct{}), done: make(chan struct{}), started: make(chan struct{})}
	b.mu.Lock()
	switch {
	case b.closed:
		// Close ran since the check above: it found no heartbeats to
		// stop, and none may start now.
		b.mu.Unlock()
		return ErrClosed
	case b.heartbeat != nil:
		// Registered already, or being registered by a call under way:
		// its outcome is this one's, and discovery tells the new card.
		hb := b.heartbeat
		b.mu.Unlock()
		select {
		case <-hb.started:
		case <-ctx.Done():
			return ctx.Err()
		}
		if hb.startErr != nil {
			return hb.startErr
		}
		b.announce(ctx, hb, card)
		return nil
	}
	b.heartbeat = hb
	b.mu.Unlock()
	since := b.onlineSince(ctx)
	if err := b.beat(ctx, since); err != nil {
		b.mu.Lock()
		if b.heartbeat == hb {
			b.heartbeat = nil
		}
		b.mu.Unlock()
		hb.startErr = fmt.Errorf("register %s: %w", b.agent, b.registryMissing(b.presence, err))
		close(hb.started)
		close(hb.done) // a Close meanwhile finds nothing to report
		return hb.startErr
	}
	hb.online = true
	hb.processes = b.answerProcesses()
	b.announce(ctx, hb, card)
	// Set before the heartbeats start, the fields are goOffline's to read
	// once they stopped (hb.done).
	hb.since = since
	close(hb.started)
	go b.heartbeats(hb)
	if b.isClosed() {
		return ErrClosed // Close stops them at once
	}
	return nil
}

// announce makes NATS micro discovery tell card (`nats micro ls
// agentbus` lists the agent), in place of the card it told before: a
// service's version and description cannot change, so the old one is
// stopped and a new one added. Not after the bus went offline.
func (b *Bus) announce(ctx context.Context, hb *heartbeat, card AgentCard) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.left {
		return
	}
	if hb.micro != nil {
		if err := hb.micro.Stop(); err != nil {
			b.opts.onError(fmt.Errorf("announce %s's new card to NATS micro discovery: %w", b.agent, err))
		}
		hb.micro = nil
	}
	version := card.Version
	if !semver.MatchString(version) {
		version = "0.0.0"
	}
	svc, err := micro.AddService(b.nc, micro.Config{
		Name: subjects.MicroService, Version: version, Description: card.Description,
		Metadata: map[string]string{"agent": b.agent, "root": b.opts.scheme.Root(), "card_version": card.Version},
	})
	if err == nil {
		// Answering once Register returns: its subscriptions reach the
		// server first.
		err = b.nc.FlushWithContext(ctx)
	}
	if err != nil {
		b.opts.onError(fmt.Errorf("announce %s to NATS micro discovery: %w", b.agent, err))
	}
	hb.micro = svc
}

// semver is the version form NATS micro accepts.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$`)

// heartbeat is a registered bus's presence reporting, its answering the
// agent's other processes, and its answering NATS micro discovery.
type heartbeat struct {
	stop, done chan struct{}
	// started is closed once the first beat's outcome is known: online,
	// or startErr. A Register meanwhile waits for it.
	started   chan struct{}
	startErr  error
	online    bool               // its first beat was written
	since     time.Time          // the agent online since, as its beats say; heartbeats' until done
	processes *nats.Subscription // nil if it could not be made

	mu    sync.Mutex    // guards micro and left: Register announces a new card (announce)
	micro micro.Service // nil if it could not be added
	left  bool          // goOffline stopped micro
}

// answerProcesses answers the requests on the agent's processes subject
// (subjects.Scheme.ProcessesSubject) until unsubscribed: this process
// keeps the agent online (anotherProcess). A failure goes to the error
// handler, and the subscription is then nil.
func (b *Bus) answerProcesses() *nats.Subscription {
	subject, err := b.opts.scheme.ProcessesSubject(b.agent)
	if err == nil {
		var sub *nats.Subscription
		interval := []byte(b.opts.heartbeat.String())
		answer := func(m *nats.Msg) {
			if m.Header.Get(headerProcess) != b.process { // not its own question
				_ = m.Respond(interval) // its heartbeat interval (goOffline)
			}
		}
		if sub, err = b.nc.Subscribe(subject, answer); err == nil {
			return sub
		}
	}
	b.opts.onError(fmt.Errorf("answer the other processes of %s: %w", b.agent, err))
	return nil
}

// onlineSince returns when the agent came online, for a process that
// registers: now, unless another process of the agent runs
// (anotherProcess) and the registry has the agent online since earlier.
// Every process then writes the same Since, and readers and watchers see
// one stretch online, not a new one at each heartbeat of another process.
func (b *Bus) onlineSince(ctx context.Context) time.Time {
	now := time.Now().UTC()
	if _, ok := b.anotherProcess(ctx); !ok {
		return now
	}
	p, _, err := b.presenceOf(ctx, b.agent)
	if err != nil || p.Status != Online || p.Since.IsZero() || p.Since.After(now) {
		return now
	}
	return p.Since
}

// anotherProcess reports whether another process of the agent answers on
// its processes subject, within processesWait: a registered process that
// runs on, whose heartbeats keep the agent online. No answer, or none
// that can come (no responders, a refusal), is no.
func (b *Bus) anotherProcess(ctx context.Context) (interval time.Duration, ok bool) {
	subject, err := b.opts.scheme.ProcessesSubject(b.agent)
	if err != nil {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, processesWait)
	defer cancel()
	ctx, stop := b.watchRefusals(ctx, subject)
	defer stop()
	q := &nats.Msg{Subject: subject, Header: nats.Header{headerProcess: []string{b.process}}}
	resp, err := b.nc.RequestMsgWithContext(ctx, q)
	if err != nil {
		return 0, false
	}
	interval, _ = time.ParseDuration(string(resp.Data)) // 0 from a version that answers nothing
	return interval, true
}

// headerProcess names the process that asks whether another process of
// its agent runs (anotherProcess), which its own answerProcesses leaves
// unanswered.
const headerProcess = "Agentbus-Process"

// processesWait bounds how long a closing process waits for another
// process of its agent to answer (anotherProcess). A running process
// answers within a round trip, and with none running the server says so
// at once (no responders).
var processesWait = time.Second // a variable for the tests

// heartbeats reports the agent online every interval until hb is stopped,
// and at once when the connection is back after a drop: the record may
// have expired meanwhile, or another process of the agent that closed then
// found none to answer it (anotherProcess) and reported the agent offline.
//
// A beat after none of this process was stored for as long as a record
// lives (its connection held, not dropped, say) asks anew since when the
// agent is online (onlineSince): its record may have expired meanwhile,
// and the agent been found gone. Before 2026-11-28 the heartbeats went on
// with the Since of before, and a lookup read the agent online since
// before it went offline.
func (b *Bus) heartbeats(hb *heartbeat) {
	defer close(hb.done)
	t := time.NewTicker(b.opts.heartbeat)
	defer t.Stop()
	stored := time.Now() // Register's beat
	for {
		select {
		case <-hb.stop:
			return
		case <-t.C:
		case <-b.reconnects.connected():
			t.Reset(b.opts.heartbeat)
		}
		if time.Since(stored) >= presenceMisses*b.opts.heartbeat {
			ctx, cancel := context.WithTimeout(context.Background(), processesWait+b.opts.heartbeat)
			hb.since = b.onlineSince(ctx)
			cancel()
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.heartbeat)
		if err := b.beat(ctx, hb.since); err != nil {
			b.opts.onError(fmt.Errorf("heartbeat of %s: %w", b.agent, err))
		} else {
			stored = time.Now()
		}
		cancel()
	}
}

// beat writes the agent's presence record online, to expire three
// intervals from now unless renewed.
func (b *Bus) beat(ctx context.Context, since time.Time) error {
	ttl := presenceMisses * b.opts.heartbeat
	return b.writePresence(ctx, presenceData{Agent: b.agent, Status: Online, Since: since, Interval: Duration(b.opts.heartbeat)}, ttl)
}

// goOffline stops the heartbeats of a registered bus and reports the agent
// offline (ReasonShutdown), waiting for the report until ctx ends, unless
// another process of the agent answers (anotherProcess): the agent is not
// gone while its other processes run, and an offline report would fail
// the requests sent to it until their next heartbeat. Close calls it.
func (b *Bus) goOffline(ctx context.Context) {
	b.mu.Lock()
	hb := b.heartbeat
	b.heartbeat = nil
	b.mu.Unlock()
	if hb == nil {
		return
	}
	close(hb.stop)
	<-hb.done
	if !hb.online {
		return // Register failed before it reported the agent online
	}
	if hb.processes != nil {
		_ = hb.processes.Unsubscribe() // this process no longer answers itself
	}
	hb.mu.Lock()
	if hb.micro != nil {
		if err := hb.micro.Stop(); err != nil {
			b.opts.onError(fmt.Errorf("leave NATS micro discovery: %w", err))
		}
	}
	hb.left = true
	hb.mu.Unlock()
	if interval, ok := b.anotherProcess(ctx); ok {
		// Its heartbeats keep the agent online; the last record may be
		// this process's, though, expiring after three of this one's
		// intervals, before the other's next beat if its interval is
		// longer: the agent read offline until then. A record that lives
		// as long as the other's does takes its place.
		if interval > b.opts.heartbeat {
			if err := b.writePresence(ctx, presenceData{Agent: b.agent, Status: Online, Since: hb.since, Interval: Duration(interval)}, presenceMisses*interval); err != nil {
				b.opts.onError(fmt.Errorf("hand %s's presence to its other process: %w", b.agent, err))
			}
		}
		return
	}
	now := time.Now().UTC()
	if err := b.writePresence(ctx, presenceData{Agent: b.agent, Status: Offline, Since: now, Interval: Duration(b.opts.heartbeat), Reason: ReasonShutdown}, 0); err != nil {
		b.opts.onError(fmt.Errorf("report %s offline: %w", b.agent, err))
	}
}

// writePresence writes d as the agent's presence record, with a TTL if ttl
// is not zero, and waits for the server to store it.
func (b *Bus) writePresence(ctx context.Context, d presenceData, ttl time.Duration) error {
	key, err := subjects.PresenceKey(b.agent)
	if err != nil {
		return err
	}
	typ := EventPresenceOnline
	if d.Status == Offline {
		typ = EventPresenceOffline
	}
	data, err := json.Marshal(presenceRecord{
		SpecVersion: codec.SpecVersion, ID: codec.NewID(), Source: codec.SourcePrefix + subjects.EncodeToken(b.agent),
		Type: typ, Time: time.Now().UTC(), DataContentType: "application/json", Data: d,
	})
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: b.presence.prefix + key, Data: data, Header: nats.Header{}}
	if ttl > 0 {
		m.Header[jetstream.MsgTTLHeader] = []string{ttlSeconds(ttl)}
	}
	_, err = publishAgain(ctx, b.js, m)
	return err
}

// registryMissing says what to do when no stream answers on kv, a bucket
// of the registry (the registry bucket or the presence bucket): provision
// the bucket if the server says its stream does not exist, and otherwise
// what streamMissing finds (JetStream off, the stream unavailable).
func (c *client) registryMissing(kv kvSubjects, err error) error {
	err = c.streamMissing(kv.stream, err)
	var missing *notProvisionedError
	if errors.As(err, &missing) {
		return fmt.Errorf("%w: the bucket %s does not exist; run 'agentbus provision' (or Admin.Provision) with this version: %w",
			ErrNotProvisioned, strings.TrimPrefix(kv.stream, "KV_"), missing.cause)
	}
	return err
}

// ErrAgentNotFound is returned by LookupAgent for an agent with neither a card
// nor a presence record.
var ErrAgentNotFound = errors.New("bus: agent not registered")

// Agents returns every agent of the registry, by name: each one's card and
// presence. An agent that reported its presence without a card has a card
// with only its Name.
func (c *client) Agents(ctx context.Context) ([]AgentInfo, error) {
	return c.readRegistry(ctx)
}

// LookupAgent returns the card and presence of agent, or ErrAgentNotFound.
func (c *client) LookupAgent(ctx context.Context, agent string) (AgentInfo, error) {
	if err := subjects.ValidateID(agent); err != nil {
		return AgentInfo{}, err
	}
	if c.isClosed() {
		return AgentInfo{}, ErrClosed
	}
	at := c
	if c.shards != nil {
		b, err := c.shards.of(ctx, agent) // where it registers
		if err != nil {
			return AgentInfo{}, err
		}
		at = b.client
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := at.watchRefusals(ctx, "$JS.API.")
	defer stop()
	key, _ := subjects.CardKey(agent) // agent is valid
	resp, err := at.getKey(ctx, at.registry, key)
	if err != nil {
		return AgentInfo{}, at.closedBy(refusedCall(ctx, fmt.Errorf("look up %s: %w", agent, at.registryMissing(at.registry, err))))
	}
	p, _, err := at.readPresence(ctx, agent)
	if err != nil {
		return AgentInfo{}, at.closedBy(refusedCall(ctx, fmt.Errorf("look up %s: %w", agent, at.registryMissing(at.presence, err))))
	}
	if resp == nil && p.Status == Unknown {
		return AgentInfo{}, fmt.Errorf("%w: %s", ErrAgentNotFound, agent)
	}
	var card AgentCard
	if resp != nil {
		card = cardOf(resp.Data)
	}
	return agentInfo(agent, card, p), nil
}

// AgentQuery selects agents by what their cards say. Empty fields select
// all; set fields must all match.
type AgentQuery struct {
	// Skill is a skill ID the agent has.
	Skill string
	// Tag is a tag of one of its skills.
	Tag string
	// Accepts is a message type it handles (a card without Accepts handles
	// any).
	Accepts string
	// Profile is an agent protocol it speaks.
	Profile string
	// Online selects only agents online now.
	Online bool
}

// FindAgents returns the agents q selects, by name.
func (c *client) FindAgents(ctx context.Context, q AgentQuery) ([]AgentInfo, error) {
	all, err := c.Agents(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(a AgentInfo) bool { return !q.matches(a) }), nil
}

// AddMatchingToGroup makes every registered agent that q selects (as
// FindAgents does) a member of group, as an operator, and returns their
// names, sorted; none when q selects nobody. It adds the agents registered
// now: one that registers later is not added. The zero AgentQuery selects
// every agent of the registry.
func (a *Admin) AddMatchingToGroup(ctx context.Context, group string, q AgentQuery) ([]string, error) {
	if _, err := subjects.GroupMemberKeys(group); err != nil {
		return nil, err
	}
	found, err := a.FindAgents(ctx, q)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(found))
	for i, ag := range found {
		names[i] = ag.Card.Name
	}
	if err := a.AddToGroup(ctx, group, names...); err != nil {
		return nil, err
	}
	return names, nil
}

func (q AgentQuery) matches(a AgentInfo) bool {
	card := a.Card
	if q.Online && a.Presence.Status != Online {
		return false
	}
	if q.Skill != "" && !slices.ContainsFunc(card.Skills, func(s Skill) bool { return s.ID == q.Skill }) {
		return false
	}
	if q.Tag != "" && !slices.ContainsFunc(card.Skills, func(s Skill) bool { return slices.Contains(s.Tags, q.Tag) }) {
		return false
	}
	if q.Accepts != "" && len(card.Accepts) > 0 && !slices.Contains(card.Accepts, q.Accepts) {
		return false
	}
	if q.Profile != "" && !slices.Contains(card.Profiles, q.Profile) {
		return false
	}
	return true
}

// readRegistry reads the last card (registry bucket) and presence record
// (presence bucket) of every agent and returns the agents they describe,
// by name.
func (c *client) readRegistry(ctx context.Context) ([]AgentInfo, error) {
	if c.shards != nil {
		return c.shards.readRegistry(ctx)
	}
	return c.readRegistryHere(ctx)
}

// readRegistryHere is readRegistry on this handle's own root.
func (c *client) readRegistryHere(ctx context.Context) ([]AgentInfo, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := c.watchRefusals(ctx, "$JS.API.")
	defer stop()
	// The two buckets are read at once: a read is a few round trips.
	var cards map[string]AgentCard
	var cardsErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		cards, cardsErr = readKeys(ctx, c, c.registry, subjects.CardKeys, func(m jetstream.Msg) AgentCard { return cardOf(m.Data()) })
	})
	presences, err := readKeys(ctx, c, c.presence, subjects.PresenceKeys, func(m jetstream.Msg) Presence {
		if p, ok := presenceOfMsg(m); ok {
			return p
		}
		return Presence{Status: Unknown}
	})
	wg.Wait()
	if err = cmp.Or(cardsErr, err); err != nil {
		return nil, err
	}
	out := make([]AgentInfo, 0, max(len(cards), len(presences)))
	for name, card := range cards {
		p, ok := presences[name]
		if !ok {
			p = Presence{Status: Unknown}
		}
		out = append(out, agentInfo(name, card, p))
	}
	for name, p := range presences {
		if _, ok := cards[name]; !ok {
			out = append(out, agentInfo(name, AgentCard{}, p))
		}
	}
	slices.SortFunc(out, func(x, y AgentInfo) int { return strings.Compare(x.Card.Name, y.Card.Name) })
	return out, nil
}

// cardOf reads a card record: the zero card if it is not one.
func cardOf(data []byte) AgentCard {
	var card AgentCard
	if json.Unmarshal(data, &card) != nil {
		return AgentCard{}
	}
	return card
}

// agentInfo is agent's card and presence as read from the registry. A
// silent agent was last seen three of its intervals before the server
// removed its presence, at most one interval after its last heartbeat.
func agentInfo(agent string, card AgentCard, p Presence) AgentInfo {
	card.Name = agent
	if p.Reason == ReasonSilent {
		interval := time.Duration(card.Heartbeat)
		if interval <= 0 {
			interval = DefaultHeartbeat
		}
		p.LastSeen = p.Since.Add(-presenceMisses * interval)
	}
	return AgentInfo{Card: card, Presence: p}
}

// readKeys reads the last record of every key of the registry's bucket kv
// that matches filter, a card or presence key filter, and returns what
// parse makes of each, by agent. A key the bus does not write is passed
// over.
func readKeys[T any](ctx context.Context, c *client, kv kvSubjects, filter string, parse func(jetstream.Msg) T) (map[string]T, error) {
	found := map[string]T{}
	cfg := jetstream.ConsumerConfig{FilterSubject: kv.prefix + filter, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy}
	err := c.reads.readStream(ctx, kv.stream, cfg, func(m jetstream.Msg, _ *jetstream.MsgMetadata) (bool, error) {
		_, name, err := subjects.ParseRegistryKey(strings.TrimPrefix(m.Subject(), kv.prefix))
		if err != nil {
			return false, nil // not a key the bus writes
		}
		found[name] = parse(m)
		return false, nil
	})
	if err != nil {
		return nil, refusedCall(ctx, fmt.Errorf("read the agent registry: %w", c.registryMissing(kv, err)))
	}
	return found, nil
}

// PresenceChange is an agent coming online or going offline.
type PresenceChange struct {
	Agent    string
	Presence Presence
	// Previous is the status before: Unknown for the first report of an
	// agent the watch has not seen.
	Previous PresenceStatus
}

// WatchPresence calls f with every agent's presence as it stands and then
// with every change, in order, until ctx ends (it returns nil then, but
// for a deadline that passed before the watch could start: that is the
// error of a call the server did not answer) or the
// handle closes (ErrClosed). A heartbeat is no change, nor one of another
// process of the agent that came online while the agent was; an agent
// that restarted (online again, since after the last heartbeat seen) is.
// The changes come from the registry bucket, where the server itself
// records an agent gone silent, so the watch needs no process to sweep
// for silent agents and sees the same as every other watcher. f runs on the watch's goroutine; a slow f
// delays the next change. The Bus of a Shards watches every shard's
// registry: each agent's changes come in order, and f is never called
// twice at once.
func (c *client) WatchPresence(ctx context.Context, f func(PresenceChange)) error {
	if f == nil {
		return fmt.Errorf("%w: nil function to call with each change", ErrInvalidOption)
	}
	if c.shards != nil {
		return watchEvery(ctx, c.shards, f, func(ctx context.Context, b *Bus, f func(PresenceChange)) error {
			return b.watchPresenceHere(ctx, f)
		})
	}
	return c.watchPresenceHere(ctx, f)
}

// watchPresenceHere is WatchPresence on this handle's own root.
func (c *client) watchPresenceHere(ctx context.Context, f func(PresenceChange)) error {
	if c.isClosed() {
		return ErrClosed
	}
	ctx, stopWatch := c.whileOpen(ctx)
	defer stopWatch()
	cons, err := refusable(ctx, c, func(ctx context.Context) (jetstream.Consumer, error) {
		return c.js.OrderedConsumer(ctx, c.presence.stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{c.presence.prefix + subjects.PresenceKeys},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
	})
	if err != nil {
		return c.watchNotStarted(ctx, fmt.Errorf("watch presence: %w", c.registryMissing(c.presence, err)))
	}
	it, err := cons.Messages()
	if err != nil {
		return c.watchNotStarted(ctx, fmt.Errorf("watch presence: %w", err))
	}
	// Stopped when ctx ends, and each Next ends with ctx too (see
	// watchGroupsHere).
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	last := map[string]Presence{}
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return c.watchFailed(ctx, fmt.Errorf("watch presence: %w", err))
		}
		_, name, err := subjects.ParseRegistryKey(strings.TrimPrefix(m.Subject(), c.presence.prefix))
		if err != nil {
			continue
		}
		p, ok := presenceOfMsg(m)
		if !ok {
			continue
		}
		prev, seen := last[name]
		if seen && p.Reason == ReasonSilent && p.LastSeen.IsZero() {
			p.LastSeen = prev.LastSeen // the last heartbeat the watch saw
		}
		if seen && prev.Status == Offline && p.Status == Online && !p.Since.After(prev.Since) {
			// Back from a silence its process never saw (a connection
			// held, not dropped): its heartbeats carry the Since of
			// before, and one written while held its time of writing. It
			// came online again when the server stored this one.
			if md, err := m.Metadata(); err == nil && md.Timestamp.After(prev.Since) {
				p.Since = md.Timestamp.UTC()
			}
		}
		last[name] = p
		if seen && prev.Status == p.Status && (prev.Since.Equal(p.Since) || p.Status == Online && !p.Since.After(prev.LastSeen)) {
			// A heartbeat; or one of another process of the agent, which
			// came online before the last heartbeat seen, while the agent
			// was online: the same stretch online.
			continue
		}
		change := PresenceChange{Agent: name, Presence: p, Previous: Unknown}
		if seen {
			change.Previous = prev.Status
		}
		f(change)
	}
}

// presenceOfMsg reads a presence record, or the server's marker that it
// was removed.
func presenceOfMsg(m jetstream.Msg) (Presence, bool) {
	if h := m.Headers(); h.Get(jetstream.MarkerReasonHeader) != "" || h.Get("KV-Operation") != "" {
		md, err := m.Metadata()
		if err != nil {
			return Presence{}, false
		}
		return Presence{Status: Offline, Since: md.Timestamp, Reason: ReasonSilent}, true
	}
	var r presenceRecord
	if err := json.Unmarshal(m.Data(), &r); err != nil {
		return Presence{}, false
	}
	var stored time.Time
	if md, err := m.Metadata(); err == nil {
		stored = md.Timestamp
	}
	return r.presence(stored), true
}

// Backlog returns, for each priority 1..5 (index 0..4), how many messages
// wait for agent, not yet delivered: what it will find when it comes back.
// That is its direct consumer's pending count, or, at a priority whose
// consumer does not exist yet (it is created with the agent's first
// message there), every message the stream holds for it at that priority.
func (a *Admin) Backlog(ctx context.Context, agent string) ([subjects.LowestPriority]uint64, error) {
	var out [subjects.LowestPriority]uint64
	cs, err := a.opts.scheme.Consumers(agent)
	if err != nil {
		return out, err
	}
	if a.isClosed() {
		return out, ErrClosed
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := a.watchRefusals(ctx, "$JS.API.")
	defer stop()
	stream := a.opts.scheme.Stream()
	var errs [subjects.LowestPriority]error
	var wg sync.WaitGroup
	for _, c := range cs { // the priorities at once: one round trip, not five
		if c.Broadcast {
			continue
		}
		wg.Go(func() {
			cons, err := a.js.Consumer(ctx, stream, c.Name)
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				out[c.Priority-1], err = a.storedCount(ctx, c.Filter)
			} else if err == nil {
				out[c.Priority-1] = cons.CachedInfo().NumPending
			}
			errs[c.Priority-1] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return out, refusedCall(ctx, fmt.Errorf("backlog of %s: %w", agent, a.notProvisioned(err)))
		}
	}
	return out, nil
}

// storedCount returns how many messages of the stream match filter.
func (a *Admin) storedCount(ctx context.Context, filter string) (uint64, error) {
	st, err := a.js.Stream(ctx, a.opts.scheme.Stream())
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}
