package bus

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
)

// Message is the one message type of the bus; see package codec for its
// fields and their CloudEvents mapping.
type Message = codec.Message

// Broadcast is the To of a message for every agent.
const Broadcast = subjects.Broadcast

// Policy chooses between priority levels when a subscription has messages
// at several: Strict or Weighted.
type Policy = consumers.Policy

// The priority policies.
const (
	Strict   = consumers.Strict
	Weighted = consumers.Weighted
)

// Bus is one agent's handle on the message bus: it publishes as the agent,
// subscribes for it, requests and replies, and looks up the lifecycle of
// the agent's messages. It is safe for concurrent use. Create one with New
// or Connect and release it with Close. Operators provision the bus and
// handle dead letters and anyone's messages with an Admin.
type Bus struct {
	*client
	agent     string
	process   string // this process among the agent's (headerProcess)
	req       requests
	presences presences // what Requests know of their recipients' presence
	cancels   cancels
	history   sync.Mutex // one Attach reads the agent's past messages at a time

	backlogReg metric.Registration
	subs       map[*Subscription]struct{} // under client.mu
	closeDone  chan struct{}              // closed when Close has done its work
	heartbeat  *heartbeat                 // under client.mu; nil until Register
}

// New returns the bus of agent on an existing connection. It does not take
// ownership of nc: Close leaves it open. agent is the identity the bus
// publishes as and consumes for; it is checked against the rules in
// docs/subjects.md (ErrInvalidAgentID). New returns ErrUnsupportedServer if
// the server is older than nats-server 2.11 (per-message TTL), and an error
// wrapping nats.ErrConnectionReconnecting or nats.ErrConnectionClosed if nc
// is not connected, so that the server's version is not known. With
// WithProvision it also provisions the stream and returns Admin.Provision's
// errors. On the root of one shard of an installation split into shards
// (subjects.ShardRoot) it returns ErrShardCount unless that is agent's
// shard: such an agent's bus is NewShards'.
func New(nc *nats.Conn, agent string, opts ...Option) (*Bus, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	if err := subjects.ValidateIdentity(agent); err != nil {
		return nil, err
	}
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	return newAgentBus(nc, agent, o, nil)
}

// Connect dials url (comma-separated for a cluster) and returns the bus of
// agent on the new connection, which Close closes. The connection reconnects
// without limit and takes its replies on the agent's inbox prefix
// (InboxPrefix), which the agent's server permissions allow;
// WithNATSOptions adds or overrides nats.Connect options, a
// nats.CustomInboxPrefix among them.
func Connect(url, agent string, opts ...Option) (*Bus, error) {
	if err := subjects.ValidateIdentity(agent); err != nil {
		return nil, err
	}
	return connectAs(url, agent, opts, func(nc *nats.Conn, o options, r *refusals) (*Bus, error) {
		return newAgentBus(nc, agent, o, r)
	})
}

// newAgentBus is newBus for New and Connect: on the root of one shard of
// an installation, it refuses an agent that lives on another
// (checkOwnShard). Shards makes its buses with newBus and checks the
// number of shards instead.
func newAgentBus(nc *nats.Conn, agent string, o options, r *refusals) (*Bus, error) {
	b, err := newBus(nc, agent, o, r)
	if err != nil {
		return nil, err
	}
	if err := b.checkOwnShard(context.Background()); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// connectAs dials url as agent's connection (dial), with opts applied, and
// returns what open makes on it: Connect's bus, ConnectShards' handle. The
// connection is closed if open fails.
func connectAs[T any](url, agent string, opts []Option, open func(*nats.Conn, options, *refusals) (T, error)) (T, error) {
	var none T
	o, err := applyOptions(opts)
	if err != nil {
		return none, err
	}
	nc, r, err := dial(url, "agentbus "+agent, InboxPrefix(agent), &o)
	if err != nil {
		return none, err
	}
	v, err := open(nc, o, r)
	if err != nil {
		nc.Close()
		return none, err
	}
	return v, nil
}

// newBus returns the bus of agent on nc with options o; r is the refusals
// of a connection dial made, nil for the caller's.
func newBus(nc *nats.Conn, agent string, o options, r *refusals) (*Bus, error) {
	c, err := newClient(nc, agent, o, r)
	if err != nil {
		return nil, err
	}
	if o.provision != nil {
		cfg := *o.provision
		if cfg.Root == "" {
			cfg.Root = o.scheme.Root()
		} else if s, err := subjects.New(cfg.Root); err != nil || s.Root() != o.scheme.Root() {
			c.closeConn()
			return nil, fmt.Errorf("%w: provision root %q differs from bus root %q", ErrInvalidOption, cfg.Root, o.scheme.Root())
		}
		// As Admin.Provision: a refused request (an agent's credentials
		// allow no stream requests) fails at once, saying so.
		ctx, stop := c.watchRefusals(context.Background(), "$JS.API.")
		_, err := provision(ctx, nc, c.js, cfg, true, o.onError)
		err = refusedCall(ctx, err)
		stop()
		if err != nil {
			c.closeConn()
			return nil, err
		}
	}
	b := &Bus{client: c, agent: agent, process: uuid.NewString(), subs: make(map[*Subscription]struct{}), closeDone: make(chan struct{})}
	if c.status != nil {
		c.status.window = b.storedBetween
	}
	if b.backlogReg, err = c.tel.meter.RegisterCallback(b.observeBacklog, c.tel.backlog, c.tel.inflight); err != nil {
		c.closeConn()
		return nil, fmt.Errorf("%w: register backlog callback: %w", ErrInvalidOption, err)
	}
	return b, nil
}

// InboxPrefix returns the reply inbox prefix of agent, "_INBOX.<token>"
// (subjects.InboxPrefix), or "" for an invalid agent ID. Connect uses it; a
// program that dials for itself and passes the connection to New gives it
// to nats.CustomInboxPrefix when the server enforces per-agent permissions
// (docs/security.md), which allow an agent no other inbox:
//
//	nc, err := nats.Connect(url, nats.CustomInboxPrefix(bus.InboxPrefix("worker-1")), ...)
func InboxPrefix(agent string) string {
	p, err := subjects.InboxPrefix(agent)
	if err != nil {
		return ""
	}
	return p
}

// Agent returns the agent this bus publishes as and consumes for.
func (b *Bus) Agent() string { return b.agent }

// Close stops every subscription, cancelling running handlers' contexts and
// waiting for them to return, reports a registered agent offline and waits
// for the publishes and lifecycle records still in flight, those two up to
// 5 s together, and
// closes the connection if Connect opened it. The Bus of a Shards closes
// the agent's buses of the other shards too (Shards.Close). Close is
// idempotent: a call while another closes returns when that one has
// (before 2026-11-28 it returned at once). Other methods return ErrClosed
// after it, and a Request, Attach or Gather waiting for replies returns it
// at once; a call that Close meets under way fails with an error wrapping
// ErrClosed.
//
// Close waits for the running handlers, so a handler, or the error
// handler, which runs on a handler's goroutine, that closes the bus would
// wait for itself for good: it calls go b.Close() instead.
func (b *Bus) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.closeDone
		return nil
	}
	b.closed = true
	close(b.closing)
	subs := b.subs
	b.subs = nil
	b.mu.Unlock()
	for s := range subs {
		s.Stop()
	}
	for s := range subs {
		<-s.Done()
	}
	b.req.close()
	// The records of the answers the listener is handing over are written
	// (a Request may have returned the reply before its record was), and
	// no subscription of this process meets the stored copies of the
	// replies its Requests took any more.
	b.req.handedOver()
	b.req.flushTaken(b.recordTaken)
	if err := b.backlogReg.Unregister(); err != nil {
		b.opts.onError(fmt.Errorf("unregister backlog callback: %w", err))
	}
	// The offline report and the writes in flight share one bound: with
	// the server away, each would wait it out.
	ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
	defer cancel()
	b.goOffline(ctx)
	b.closeFlushed(ctx)
	// Done before the other shards' buses close: Shards.Close closes this
	// one too, and must not wait for the call that runs it.
	close(b.closeDone)
	if b.shards != nil {
		return b.shards.Close() // the agent's buses of the other shards
	}
	return nil
}

// minServer is the oldest nats-server with per-message TTL (Nats-TTL).
var minServer = [3]int{2, 11, 0}

// checkServer reports ErrUnsupportedServer if the connected server is
// older than minServer, and notConnected's error if nc is not connected.
func checkServer(nc *nats.Conn) error {
	v := nc.ConnectedServerVersion()
	if v == "" {
		return fmt.Errorf("server version unknown: %w", notConnected(nc))
	}
	got, ok := parseVersion(v)
	if !ok {
		return fmt.Errorf("%w: cannot parse server version %q", ErrUnsupportedServer, v)
	}
	if !atLeast(got, minServer) {
		return fmt.Errorf("%w: found nats-server %s, need %d.%d.%d or later for per-message TTL", ErrUnsupportedServer, v, minServer[0], minServer[1], minServer[2])
	}
	return nil
}

// notConnected says why nc, which is not connected, is not: it is closed,
// or still trying to reach a server.
func notConnected(nc *nats.Conn) error {
	switch {
	case nc.IsClosed():
		return nats.ErrConnectionClosed
	case nc.IsDraining():
		return nats.ErrConnectionDraining
	}
	return nats.ErrConnectionReconnecting
}

// atLeast reports whether version v is least or later.
func atLeast(v, least [3]int) bool {
	for i := range v {
		if v[i] != least[i] {
			return v[i] > least[i]
		}
	}
	return true
}

func parseVersion(v string) ([3]int, bool) {
	var out [3]int
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}

// notProvisioned tells apart the two reasons the message stream does not
// answer, as streamMissing does.
func (b *client) notProvisioned(err error) error {
	return b.streamMissing(b.opts.scheme.Stream(), err)
}

// streamMissing tells apart the two reasons no stream answers: stream does
// not exist (ErrNotProvisioned), or it exists but cannot answer now, such
// as a replicated stream that lost its quorum (ErrUnavailable). Only on
// this error path does it ask the server which.
func (b *client) streamMissing(stream string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return &notProvisionedError{stream: stream, cause: err}
	case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders):
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var ierr error
		if b.consumer != "" && stream == b.opts.scheme.Stream() {
			// An agent may not ask for stream info, only for its own
			// consumers' (docs/security.md): a missing stream has none.
			_, ierr = b.js.Consumer(ctx, stream, b.consumer)
		} else {
			_, ierr = b.js.Stream(ctx, stream)
		}
		switch {
		case errors.Is(ierr, jetstream.ErrStreamNotFound):
			return &notProvisionedError{stream: stream, cause: err}
		case errors.Is(ierr, nats.ErrNoResponders), // nothing answers the JetStream API
			errors.Is(ierr, jetstream.ErrJetStreamNotEnabled), errors.Is(ierr, jetstream.ErrJetStreamNotEnabledForAccount):
			return fmt.Errorf("%w: JetStream is not enabled on this server or for this account; start nats-server with -js (or a jetstream block in its configuration): %w", ErrUnsupportedServer, ierr)
		}
		return fmt.Errorf("%w: stream %s: %w", ErrUnavailable, stream, err)
	case unavailableAPI(err):
		return fmt.Errorf("%w: stream %s: %w", ErrUnavailable, stream, err)
	}
	return err
}

// unavailableAPI reports whether err is the JetStream API's answer that it
// cannot serve now: a 503 (the cluster's meta group or a stream without a
// leader, JetStream temporarily unavailable), or a proposal of the same
// message still in process where the stream lost its quorum (10158).
// Before 2026-11-28 these reached callers as nats.go's APIError.
func unavailableAPI(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.Code == 503 || apiErr.ErrorCode == errCodeDuplicateInProcess)
}

// notProvisionedError says which stream (or, with bucket, which status
// bucket) is missing and what to run; it wraps ErrNotProvisioned and the
// server's answer, which it does not print (for a subscription that is one
// answer per consumer).
type notProvisionedError struct {
	stream string
	bucket bool
	cause  error
}

func (e *notProvisionedError) Error() string {
	what := "stream"
	if e.bucket {
		what = "status bucket"
	}
	return fmt.Sprintf("%v: %s %s does not exist on this server; run 'agentbus provision' (or bus.Admin.Provision) with the same root first", ErrNotProvisioned, what, e.stream)
}

func (e *notProvisionedError) Unwrap() []error { return []error{ErrNotProvisioned, e.cause} }

// RedactURLs returns a comma-separated list of server URLs with every
// password or token masked as "xxxxx", for messages and logs: nats.go
// takes credentials from the URL, and its errors quote it.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := neturl.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
			if _, hasPassword := u.User.Password(); !hasPassword {
				u.User = neturl.User("xxxxx") // a token
				parts[i] = u.String()
			}
		}
	}
	return strings.Join(parts, ",")
}
