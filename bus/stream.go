package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/subjects"
)

// Defaults for StreamConfig.
const (
	DefaultMaxAge          = 30 * 24 * time.Hour
	DefaultDuplicateWindow = time.Hour
	// DefaultMaxConsumers allows 20,000 agents at six consumers each (a
	// direct consumer per priority level and one for the broadcasts), or
	// 60,000 sent messages at one priority (a direct consumer is created
	// with its priority's first message). The server's own default, 1,000
	// per stream, would stop at 166 agents of six, and an unlimited stream
	// falls back to that default.
	DefaultMaxConsumers = 120_000
)

// StreamConfig declares the JetStream stream that carries the bus's
// messages. Provision makes the server match it.
type StreamConfig struct {
	// Root is the first subject token(s) of every bus subject. Empty means
	// subjects.DefaultRoot ("agentbus"); the stream is named after it.
	Root string
	// Replicas is the number of copies in a cluster. Zero means 1.
	Replicas int
	// MaxAge is how long a message is kept. Zero means DefaultMaxAge.
	MaxAge time.Duration
	// DuplicateWindow is how long a message ID is remembered to drop
	// republished copies. Zero means DefaultDuplicateWindow. Every server
	// that holds a replica keeps each ID of the window in memory (see
	// DedupMemory); PeakPublishRate and DedupMemoryBudget bound that.
	DuplicateWindow time.Duration
	// PeakPublishRate is the most messages per second the operator expects
	// the stream to take, from all publishers together. Provision checks
	// the duplicate window's memory at this rate against
	// DedupMemoryBudget. Zero means not stated: nothing is checked, and
	// Warnings says the memory is unbounded.
	PeakPublishRate int
	// DedupMemoryBudget is the most memory, in bytes on each server, the
	// duplicate window may take at PeakPublishRate. Zero means
	// DefaultDedupMemoryBudget. It is checked only when PeakPublishRate is
	// stated.
	DedupMemoryBudget int64
	// MaxConsumers bounds the stream's consumers (up to six per agent,
	// subjects.ConsumersPerAgent). Zero means DefaultMaxConsumers.
	MaxConsumers int
	// MaxBytes bounds the stream's size; the oldest messages are removed
	// first. Zero means no limit. It does not bound the schedule stream,
	// whose oldest messages are the schedules still waiting.
	MaxBytes int64
	// MaxMsgSize bounds one message. Zero means the server's max payload.
	MaxMsgSize int32
	// Memory stores messages in memory instead of files. The zero value,
	// file storage, is what survives restarts.
	Memory bool
	// DeadLetterMaxAge is how long the dead-letter stream keeps a message.
	// Zero means DefaultDeadLetterMaxAge.
	DeadLetterMaxAge time.Duration
	// Tags places the root's streams and buckets on the servers of a
	// cluster that have every one of these server tags (server_tags in
	// nats-server's configuration), so that an operator decides where a
	// shard's consumers live ([Shards], docs/operations.md). None means the
	// cluster places them by its own balance; a server outside a cluster
	// ignores them.
	Tags []string
	// Shards is the number of shards of the installation Root is one
	// shard of (subjects.ShardRoot), for an installation split into
	// shards; zero or one for one that is not. Provision records it in
	// the root's registry (subjects.InstallationKey), and every process
	// given another number (NewShards, ConnectShards) or a shard that is
	// not its agent's (New, Connect on a shard's root) is refused with
	// ErrShardCount.
	Shards int
}

// Validate reports whether c is a config the server can accept.
func (c StreamConfig) Validate() error {
	if _, err := subjects.New(c.Root); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	switch {
	case c.Replicas < 0 || c.Replicas > 5:
		return fmt.Errorf("%w: replicas %d: 1 to 5 (0: 1)", ErrInvalidOption, c.Replicas)
	case c.MaxAge < 0:
		return fmt.Errorf("%w: max age %v is negative", ErrInvalidOption, c.MaxAge)
	case c.DuplicateWindow < 0:
		return fmt.Errorf("%w: duplicate window %v is negative", ErrInvalidOption, c.DuplicateWindow)
	case c.PeakPublishRate < 0:
		return fmt.Errorf("%w: peak publish rate %d is negative", ErrInvalidOption, c.PeakPublishRate)
	case c.DedupMemoryBudget < 0:
		return fmt.Errorf("%w: dedup memory budget %d is negative", ErrInvalidOption, c.DedupMemoryBudget)
	case c.MaxConsumers < 0:
		return fmt.Errorf("%w: max consumers %d is negative", ErrInvalidOption, c.MaxConsumers)
	case c.MaxBytes < 0:
		return fmt.Errorf("%w: max bytes %d is negative", ErrInvalidOption, c.MaxBytes)
	case c.MaxMsgSize < 0:
		return fmt.Errorf("%w: max message size %d is negative", ErrInvalidOption, c.MaxMsgSize)
	case c.DeadLetterMaxAge < 0:
		return fmt.Errorf("%w: dead-letter max age %v is negative", ErrInvalidOption, c.DeadLetterMaxAge)
	case slices.Contains(c.Tags, ""):
		return fmt.Errorf("%w: an empty placement tag", ErrInvalidOption)
	case c.Shards < 0 || c.Shards > subjects.MaxShards:
		return fmt.Errorf("%w: shards %d: 1 to %d (0: 1)", ErrInvalidOption, c.Shards, subjects.MaxShards)
	}
	if c.Shards > 1 {
		if _, k, ok := subjects.ParseShardRoot(c.Root); !ok || k >= c.Shards {
			return fmt.Errorf("%w: root %q is not one of %d shards' roots (subjects.ShardRoot)", ErrInvalidOption, c.Root, c.Shards)
		}
	}
	maxAge := orDefault(c.MaxAge, DefaultMaxAge)
	dw := orDefault(c.DuplicateWindow, DefaultDuplicateWindow)
	if dw > maxAge {
		return fmt.Errorf("%w: duplicate window %v exceeds max age %v", ErrInvalidOption, dw, maxAge)
	}
	if dw < minDuplicateWindow {
		return fmt.Errorf("%w: duplicate window %v is under the server's least, %v", ErrInvalidOption, dw, minDuplicateWindow)
	}
	return nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// JetStream returns the stream configuration c stands for.
func (c StreamConfig) JetStream() (jetstream.StreamConfig, error) {
	if err := c.Validate(); err != nil {
		return jetstream.StreamConfig{}, err
	}
	s, _ := subjects.New(c.Root)
	storage := jetstream.FileStorage
	if c.Memory {
		storage = jetstream.MemoryStorage
	}
	return jetstream.StreamConfig{
		Name:         s.Stream(),
		Description:  "agentbus messages under " + s.Root(),
		Subjects:     s.StreamSubjects(),
		Retention:    jetstream.LimitsPolicy,
		Discard:      jetstream.DiscardOld,
		Storage:      storage,
		Replicas:     orDefault(c.Replicas, 1),
		MaxAge:       orDefault(c.MaxAge, DefaultMaxAge),
		Duplicates:   orDefault(c.DuplicateWindow, DefaultDuplicateWindow),
		MaxConsumers: orDefault(c.MaxConsumers, DefaultMaxConsumers),
		MaxBytes:     orDefault(c.MaxBytes, -1),
		MaxMsgSize:   orDefault(c.MaxMsgSize, -1),
		MaxMsgs:      -1,
		AllowMsgTTL:  true,
		// A status lookup reads a message by its indexed subject
		// (subjects.Scheme.MessageFilters) with a direct get.
		AllowDirect: true,
		Placement:   c.placement(),
	}, nil
}

// placement is where the root's streams and buckets go: on servers with
// every one of c.Tags, or where the cluster chooses.
func (c StreamConfig) placement() *jetstream.Placement {
	if len(c.Tags) == 0 {
		return nil
	}
	return &jetstream.Placement{Tags: c.Tags}
}

// DeadLetterJetStream returns the configuration of the dead-letter stream:
// the stream's name with "_DLQ", the <root>.dlq.> subjects, file storage
// (or memory, like the stream), no per-message TTL.
func (c StreamConfig) DeadLetterJetStream() (jetstream.StreamConfig, error) {
	main, err := c.JetStream()
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	s, _ := subjects.New(c.Root)
	maxAge := orDefault(c.DeadLetterMaxAge, DefaultDeadLetterMaxAge)
	return jetstream.StreamConfig{
		Name:        s.DeadLetterStream(),
		Description: "agentbus dead letters under " + s.Root(),
		Subjects:    s.DeadLetterSubjects(),
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     main.Storage,
		Replicas:    main.Replicas,
		Placement:   main.Placement,
		MaxAge:      maxAge,
		Duplicates:  min(deadLetterDedupWindow, maxAge),
		MaxBytes:    -1,
		MaxMsgs:     -1,
		MaxMsgSize:  -1,
	}, nil
}

// UnsettledJetStream returns the configuration of the stream that keeps
// the server's MAX_DELIVERIES advisories of the message stream (a message
// whose last allowed delivery was never settled) until the dead-letter
// watcher (Admin.WatchDeadLetters) has dead-lettered their messages: the
// stream's name with "_UNSETTLED", work-queue retention, storage, replicas
// and age like the dead-letter stream's. Kept in a stream, an advisory that
// comes while no watcher runs, or while its connection is down, waits for
// it; one only published was lost, and its message stayed "delivered" for
// good, never handled and never dead-lettered.
func (c StreamConfig) UnsettledJetStream() (jetstream.StreamConfig, error) {
	dlq, err := c.DeadLetterJetStream()
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	s, _ := subjects.New(c.Root)
	return jetstream.StreamConfig{
		Name:        s.UnsettledStream(),
		Description: "agentbus deliveries never settled under " + s.Root() + ", for the dead-letter watcher",
		Subjects:    []string{s.MaxDeliveriesAdvisories()},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     dlq.Storage,
		Replicas:    dlq.Replicas,
		Placement:   dlq.Placement,
		MaxAge:      dlq.MaxAge,
		MaxBytes:    -1,
		MaxMsgs:     -1,
		MaxMsgSize:  -1,
	}, nil
}

// ScheduleJetStream returns the configuration of the schedule stream: the
// stream's name with "_SCHED", the schedule and fired subjects
// (subjects.Scheme.ScheduleSubjects), storage and replicas like the stream,
// message schedules and per-message TTL allowed, no age limit (a schedule
// waits as long as it must; a fired message expires by its Nats-TTL) and
// no size limit (MaxBytes bounds the message stream only: a limit here
// would remove the oldest messages, the schedules still waiting, to keep
// the fired copies), and the headers of each fired direct message
// republished as a firing notice.
// The server allows rollups on a stream with schedules (docs/security.md).
func (c StreamConfig) ScheduleJetStream() (jetstream.StreamConfig, error) {
	main, err := c.JetStream()
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	s, _ := subjects.New(c.Root)
	firedSource, firingNotice := s.FiringRePublish()
	return jetstream.StreamConfig{
		Name:              s.ScheduleStream(),
		Description:       "agentbus scheduled messages under " + s.Root(),
		Subjects:          s.ScheduleSubjects(),
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		Storage:           main.Storage,
		Replicas:          main.Replicas,
		Placement:         main.Placement,
		Duplicates:        main.Duplicates,
		MaxBytes:          -1,
		MaxMsgSize:        main.MaxMsgSize,
		MaxMsgs:           -1,
		AllowMsgTTL:       true,
		AllowMsgSchedules: true,
		AllowRollup:       true,
		// A fired direct message is heard by its recipient's subscriber
		// as a firing notice: see subjects.Scheme.FiringRePublish.
		RePublish: &jetstream.RePublish{Source: firedSource, Destination: firingNotice, HeadersOnly: true},
	}, nil
}

// scheduleSource is the source through which the message stream takes in
// the messages the schedule stream fires, on their ordinary subjects.
func (c StreamConfig) scheduleSource() *jetstream.StreamSource {
	s, _ := subjects.New(c.Root)
	src := &jetstream.StreamSource{Name: s.ScheduleStream()}
	for _, t := range s.ScheduleSourceTransforms() {
		src.SubjectTransforms = append(src.SubjectTransforms, jetstream.SubjectTransformConfig{Source: t[0], Destination: t[1]})
	}
	return src
}

// provision is Admin.Provision on nc. An unsettled stream the server
// refuses because another stream of the account captures its advisories
// already (a monitoring stream of every advisory, say) is left out and
// reported to onError: the dead-letter watcher then hears the advisories
// only while it runs (Admin.WatchDeadLetters).
//
// With keep (a bus provisioning as it starts, WithProvision) an existing
// stream or bucket keeps its limits and placement (keepOperators): only
// what the bus needs to work is brought to c. Without it (Admin.Provision,
// agentbus provision) they are made to match c.
func provision(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, c StreamConfig, keep bool, onError func(error)) (*jetstream.StreamInfo, error) {
	if err := checkServer(nc); err != nil {
		return nil, err
	}
	cfg, err := c.JetStream()
	if err != nil {
		return nil, err
	}
	if err := c.CheckDedupMemory(); err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	dlq, err := c.DeadLetterJetStream()
	if err != nil {
		return nil, err
	}
	unsettled, err := c.UnsettledJetStream()
	if err != nil {
		return nil, err
	}
	kvc, err := c.StatusBucketConfig()
	if err != nil {
		return nil, err
	}
	reg, err := c.RegistryConfig()
	if err != nil {
		return nil, err
	}
	presence, err := c.PresenceConfig()
	if err != nil {
		return nil, err
	}
	streams := []jetstream.StreamConfig{cfg, dlq, unsettled}
	if v, ok := parseVersion(nc.ConnectedServerVersion()); ok && atLeast(v, minScheduleServer) {
		sched, err := c.ScheduleJetStream()
		if err != nil {
			return nil, err
		}
		cfg.Sources = []*jetstream.StreamSource{c.scheduleSource()}
		streams = []jetstream.StreamConfig{sched, cfg, dlq, unsettled}
	}
	var info *jetstream.StreamInfo
	for _, sc := range streams {
		s, err := askAgain(ctx, reconnectsOf(js), func(ctx context.Context) (jetstream.Stream, error) {
			return createOrUpdateStream(ctx, js, sc, c.Root, keep)
		})
		if sc.Name == unsettled.Name && isAPIError(err, jsErrCodeStreamSubjectOverlap) {
			onError(fmt.Errorf("stream %s not provisioned: %w; the dead-letter watcher hears the MAX_DELIVERIES advisories of %s only while it runs", sc.Name, err, cfg.Name))
			continue
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
				return nil, fmt.Errorf("%w: %w", ErrUnsupportedServer, err)
			}
			return nil, fmt.Errorf("provision stream %s: %w", sc.Name, err)
		}
		if sc.Name == cfg.Name {
			info = s.CachedInfo()
		}
	}
	if err := provisionBucket(ctx, js, kvc, false, keep); err != nil {
		return nil, fmt.Errorf("provision status bucket %s: %w", kvc.Bucket, err)
	}
	if err := provisionBucket(ctx, js, reg, false, keep); err != nil {
		return nil, fmt.Errorf("provision agent registry %s: %w", reg.Bucket, err)
	}
	// The presence bucket allows rollups: the server keeps them on for a
	// stream with subject delete markers (docs/security.md).
	if err := provisionBucket(ctx, js, presence, true, keep); err != nil {
		return nil, fmt.Errorf("provision presence bucket %s: %w", presence.Bucket, err)
	}
	if c.Shards > 1 {
		if err := recordShards(ctx, nc, js, c.Root, c.Shards, keep); err != nil {
			return nil, err
		}
	}
	return info, nil
}

// createOrUpdateStream creates the stream cfg, or updates it unless it has
// cfg already (sameStream). Every process made WithProvision provisions as
// it starts, and an update it does not need rewrites the stream's
// configuration (on a cluster, through the meta layer's log); made by
// processes at once, such updates also trip a data race in nats-server
// 2.15, which reads a stream's configuration unlocked to check the stream
// sourcing it (getStream in checkStreamCfgLocked) while another update
// writes it.
//
// A stream of the name that holds another root's subjects is refused, not
// taken over: roots that differ only in case, or in '.' and '_', name the
// same streams (subjects.Scheme.StreamName). With keep, an existing stream
// keeps its limits and placement (keepOperators).
func createOrUpdateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, root string, keep bool) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// A create, not nats.go's create-or-update: a stream another
		// process made meanwhile as cfg asks is handed back unchanged.
		if s, err = js.CreateStream(ctx, cfg); !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return s, err
		}
		s, err = js.Stream(ctx, cfg.Name) // made otherwise: updated below
	}
	if err != nil {
		return nil, err
	}
	have := s.CachedInfo().Config
	if otherRoot(have.Subjects, cfg.Subjects, root) {
		return nil, fmt.Errorf("%w: stream %s holds another root's subjects (%s), not root %q's: roots that differ only in case, or in '.' and '_', cannot share an account",
			ErrInvalidOption, cfg.Name, strings.Join(have.Subjects, " "), root)
	}
	if keep {
		cfg = keepOperators(have, cfg)
	}
	if sameStream(have, cfg) {
		return s, nil
	}
	return js.UpdateStream(ctx, cfg)
}

// otherRoot reports whether an existing stream with subjects have belongs
// to another root than the one, root, whose subjects want are: want's are
// all under root (not the advisories the unsettled stream keeps, which
// name no root), and none of have's is.
func otherRoot(have, want []string, root string) bool {
	prefix := root + "."
	for _, s := range want {
		if !strings.HasPrefix(s, prefix) {
			return false
		}
	}
	for _, s := range have {
		if strings.HasPrefix(s, prefix) {
			return false
		}
	}
	return len(have) > 0
}

// keepOperators returns want with the limits and placement of have, an
// existing stream: what an operator set (Admin.Provision with other
// values, agentbus provision --tag, nats stream edit) and a bus
// provisioning as it starts (WithProvision) with its own StreamConfig,
// most often the defaults, must not undo. Before 2026-11-28 it did: a
// shorter retention removed messages at once, and a replicated stream lost
// its replicas and placement. What the bus needs to work (subjects,
// sources, per-message TTLs, delete markers, schedules) comes from want.
func keepOperators(have, want jetstream.StreamConfig) jetstream.StreamConfig {
	want.Description, want.Metadata = have.Description, have.Metadata
	want.MaxConsumers, want.MaxMsgs, want.MaxBytes, want.MaxAge = have.MaxConsumers, have.MaxMsgs, have.MaxBytes, have.MaxAge
	want.MaxMsgsPerSubject, want.MaxMsgSize, want.Duplicates = have.MaxMsgsPerSubject, have.MaxMsgSize, have.Duplicates
	want.Replicas, want.Placement, want.Compression = have.Replicas, have.Placement, have.Compression
	return want
}

// sameStream reports whether the stream configuration have, as the server
// reports it, is want with what want leaves to the server filled in: no
// limit (-1) for a zero limit, the server's duplicate window for none, and
// the server's own metadata (_nats.*). Anything else that differs, a
// default of a server version this does not know among it, makes the
// caller update the stream, as it did before it looked.
func sameStream(have, want jetstream.StreamConfig) bool {
	for _, limit := range []*int64{&want.MaxMsgs, &want.MaxBytes, &want.MaxMsgsPerSubject} {
		if *limit == 0 {
			*limit = -1
		}
	}
	if want.MaxMsgSize == 0 {
		want.MaxMsgSize = -1
	}
	if want.MaxConsumers == 0 {
		want.MaxConsumers = -1
	}
	if want.Duplicates == 0 {
		want.Duplicates = have.Duplicates
	}
	if len(have.Metadata) > 0 {
		md := maps.Clone(want.Metadata) // not the caller's
		if md == nil {
			md = map[string]string{}
		}
		for k, v := range have.Metadata {
			if strings.HasPrefix(k, "_nats.") {
				md[k] = v
			}
		}
		want.Metadata = md
	}
	return reflect.DeepEqual(have, want)
}

// provisionBucket creates the KeyValue bucket cfg, with rollups allowed
// only if rollups, or brings the stream of an existing one to cfg, where
// it differs (bucketStream). An existing bucket's stream is updated
// directly: nats.go's update of a bucket turns rollups on, which
// denyRollups turned off again only after it, so that every provision left
// a window in which an agent could purge the status bucket or the
// registry; and it asks to turn per-message TTLs off, which the server
// refuses, on a registry provisioned before presence had a bucket of its
// own (2026-11-27). Such a registry loses its subject delete markers and
// rollups, keeps its TTLs, and its presence records expire there unread.
//
// With keep, an existing bucket keeps its limits and placement
// (keepOperators), as a stream does.
func provisionBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, rollups, keep bool) error {
	_, err := askAgain(ctx, reconnectsOf(js), func(ctx context.Context) (struct{}, error) {
		s, err := js.Stream(ctx, "KV_"+cfg.Bucket)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			_, err = createOrUpdateBucket(ctx, js, cfg)
			return struct{}{}, err
		}
		if err != nil {
			return struct{}{}, err
		}
		have := s.CachedInfo().Config
		want := bucketStream(have, cfg, rollups)
		if keep {
			want = keepOperators(have, want)
		}
		if !reflect.DeepEqual(have, want) {
			_, err = js.UpdateStream(ctx, want)
		}
		return struct{}{}, err
	})
	if err != nil || rollups {
		return err
	}
	return denyRollups(ctx, js, "KV_"+cfg.Bucket) // nats.go creates a bucket with rollups allowed
}

// bucketStream is have, the stream of an existing bucket, with what cfg
// sets, mapped as nats.go maps a KeyValueConfig to its stream, and rollups
// as asked. What cfg leaves to nats.go's defaults or the server's stays as
// it is, and so do per-message TTLs once allowed: the server cannot turn
// them off.
func bucketStream(have jetstream.StreamConfig, cfg jetstream.KeyValueConfig, rollups bool) jetstream.StreamConfig {
	want := have
	want.Description = cfg.Description
	want.MaxMsgsPerSubject = int64(max(cfg.History, 1))
	want.MaxBytes = cmp.Or(cfg.MaxBytes, -1)
	want.MaxMsgSize = cmp.Or(cfg.MaxValueSize, -1)
	want.MaxAge = cfg.TTL
	want.Duplicates = 2 * time.Minute // nats.go's window, or the TTL when shorter
	if cfg.TTL > 0 && cfg.TTL < want.Duplicates {
		want.Duplicates = cfg.TTL
	}
	want.Storage = cfg.Storage
	want.Replicas = max(cfg.Replicas, 1)
	want.Placement = cfg.Placement
	want.SubjectDeleteMarkerTTL = cfg.LimitMarkerTTL
	want.AllowMsgTTL = have.AllowMsgTTL || cfg.LimitMarkerTTL != 0
	want.AllowRollup = rollups
	return want
}

// createOrUpdateBucket is js.CreateOrUpdateKeyValue, made once more when
// another process created the bucket between its update, which found none,
// and its create: that process's denyRollups may have changed the bucket's
// stream already, so the create asks for another configuration than the
// stream has, and the server refuses it as a name in use. The second call
// finds the bucket and updates it.
func createOrUpdateBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
	}
	return kv, err
}

// denyRollups turns rollups off on stream. nats.go creates KeyValue buckets
// with rollups allowed, and an agent that may write one key of the status
// bucket could then purge every key with one "Nats-Rollup: all" header
// (docs/security.md). The bus never rolls up a record. The message streams
// allow no rollups from the start.
func denyRollups(ctx context.Context, js jetstream.JetStream, stream string) error {
	_, err := askAgain(ctx, reconnectsOf(js), func(ctx context.Context) (struct{}, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return struct{}{}, err
		}
		cfg := s.CachedInfo().Config
		if !cfg.AllowRollup {
			return struct{}{}, nil
		}
		cfg.AllowRollup = false
		_, err = js.UpdateStream(ctx, cfg)
		return struct{}{}, err
	})
	return err
}

// jsErrCodeStreamSubjectOverlap is the server's error for a stream whose
// subjects another stream of the account captures (nats-server
// JSStreamSubjectOverlapErr), which nats.go does not name.
const jsErrCodeStreamSubjectOverlap jetstream.ErrorCode = 10065

// jsErrCodeHeaderExceedsMaximum is the server's error for a message whose
// headers pass 64 KiB, whatever its max_payload (nats-server
// JSStreamHeaderExceedsMaximumErr), which nats.go does not name.
const jsErrCodeHeaderExceedsMaximum jetstream.ErrorCode = 10097

// defaultTimeout bounds calls to the server when the caller's context has
// no deadline.
const defaultTimeout = 10 * time.Second

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultTimeout)
}
