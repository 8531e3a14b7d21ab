package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Admin is an operator's handle on the bus: it provisions the streams and
// the status bucket, sets agents' consumers up, looks up anyone's
// messages and conversations, and lists, replays, purges and watches for
// dead letters. It is no agent: it publishes nothing of its own and
// consumes nothing. Its connection needs an operator's permissions (the
// admin identity of "agentbus auth init"); an agent's are refused. It is
// safe for concurrent use. Create one with NewAdmin or ConnectAdmin and
// release it with Close.
type Admin struct {
	*client
}

// NewAdmin returns an operator's handle on the bus on nc, which Close
// leaves open. Of the options, those about the subject root, the lifecycle
// tracking, errors, logs and telemetry apply; the others are a Bus's.
func NewAdmin(nc *nats.Conn, opts ...Option) (*Admin, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	return newAdmin(nc, o, nil)
}

// ConnectAdmin dials url (comma-separated for a cluster) and returns an
// operator's handle on the new connection, which Close closes. The
// connection reconnects without limit; WithNATSOptions adds or overrides
// nats.Connect options (the operator's credentials among them).
func ConnectAdmin(url string, opts ...Option) (*Admin, error) {
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	nc, r, err := dial(url, "agentbus admin", "", &o)
	if err != nil {
		return nil, err
	}
	a, err := newAdmin(nc, o, r)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return a, nil
}

func newAdmin(nc *nats.Conn, o options, r *refusals) (*Admin, error) {
	c, err := newClient(nc, "", o, r)
	if err != nil {
		return nil, err
	}
	if c.status != nil {
		c.status.window = func(ctx context.Context, filter, _, _ string) ([]Status, error) {
			return c.status.storedIn(ctx, filter)
		}
	}
	return &Admin{client: c}, nil
}

// Close waits up to 5 seconds for the lifecycle records still being
// written to be stored, as Bus.Close does (a lookup writes back the final
// states it derives), then closes the connection if ConnectAdmin opened
// it. It is idempotent; other methods return ErrClosed after it.
func (a *Admin) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	close(a.closing)
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
	defer cancel()
	a.closeFlushed(ctx)
	return nil
}

// Provision creates the stream c declares, its dead-letter stream and the
// lifecycle status bucket (see StatusBucketConfig), or updates them in
// place to match, and returns the stream's info. c.Root defaults to the
// admin's root (WithRoot). It is idempotent and safe to run from several
// processes. It returns ErrUnsupportedServer if the server cannot carry the
// bus, a *DedupBudgetError (errors.Is ErrDedupOverBudget) without touching
// the server if the duplicate window at c.PeakPublishRate needs more memory
// than c.DedupMemoryBudget, and the server's error (a *jetstream.APIError)
// if it refuses the update, for example a change of storage type.
func (a *Admin) Provision(ctx context.Context, c StreamConfig) (*jetstream.StreamInfo, error) {
	return a.provision(ctx, c, false)
}

// EnsureProvisioned is Provision for a service that starts on an
// installation an operator may have provisioned with other limits (as
// agentbus serve does on each start): it creates what is missing, and
// brings an existing stream or bucket only to what the bus needs to work,
// keeping its limits and placement (retention, consumers, sizes, the
// duplicate window, replicas, placement, compression), as a bus made
// WithProvision does. Its errors are Provision's.
func (a *Admin) EnsureProvisioned(ctx context.Context, c StreamConfig) (*jetstream.StreamInfo, error) {
	return a.provision(ctx, c, true)
}

// provision is Provision, with keep as provision takes it.
func (a *Admin) provision(ctx context.Context, c StreamConfig, keep bool) (*jetstream.StreamInfo, error) {
	if a.isClosed() {
		return nil, ErrClosed
	}
	if c.Root == "" {
		c.Root = a.opts.scheme.Root()
	}
	ctx, stop := a.watchRefusals(ctx, "$JS.API.")
	defer stop()
	info, err := provision(ctx, a.nc, a.js, c, keep, a.opts.onError)
	return info, refusedCall(ctx, err)
}

// EnsureConsumers makes sure the six durable consumers of agent exist,
// with the settings opts give: its direct consumer of every priority and
// its broadcast consumer. An operator sets agents up before they first run
// ("agentbus provision --agent"), so that they get the broadcasts sent in
// between, and with the operator's identity, so that an agent never
// creates its own consumers (docs/security.md, push consumers). An agent
// that sets itself up (Bus.Subscribe, Bus.EnsureConsumers) creates a
// priority's direct consumer only once it has a message at that priority.
//
// Errors: ErrInvalidAgentID, ErrInvalidOption, ErrNotProvisioned,
// ErrClosed, or the server's.
func (a *Admin) EnsureConsumers(ctx context.Context, agent string, opts ...SubscribeOption) error {
	return a.ensureConsumersOf(ctx, agent, opts, true)
}
