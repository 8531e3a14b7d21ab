package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/subjects"
)

// The operator's commands on an installation split into shards (the global
// --shards, docs/operations.md "Past one stream: shards"). Each shard is a
// root of its own, so an operator's handle (bus.Admin) sees one. A command
// that reads agents, groups or records takes a handle on each shard and
// reads them all (withAdmins), or the one shard of the agent it names
// (withAdminOf); a command that works on one shard's stream, such as
// dlq replay SEQ, refuses --shards (withAdmin) rather than read the
// unsharded root, which an installation of shards leaves empty.

// withAdmin connects an operator's handle (bus.ConnectAdmin) under --root
// with the connection flags, runs f and closes it. Background errors
// become warnings. With --shards above 1 it refuses, with a usage error
// that names the shards' roots: its command works on one root.
func (a *app) withAdmin(f func(*bus.Admin) error) error {
	if a.shards > 1 {
		last, _ := subjects.ShardRoot(a.root, a.shards-1, a.shards) // checked by checkRootAndShards
		first, _ := subjects.ShardRoot(a.root, 0, a.shards)
		return usagef("--shards %d: %s works on one shard at a time: give the shard's root with --root (%s to %s) instead of --shards", a.shards, a.command, first, last)
	}
	return a.withAdminOn(a.root, f)
}

// withAdminOf runs f with an operator's handle on agent's shard: the root
// itself for one shard.
func (a *app) withAdminOf(agent string, f func(*bus.Admin) error) error {
	k, err := subjects.ShardOf(agent, a.shards)
	if err != nil {
		return usageError{err}
	}
	root, err := subjects.ShardRoot(a.root, k, a.shards)
	if err != nil {
		return usageError{fmt.Errorf("--shards: %w", err)}
	}
	return a.withAdminOn(root, func(admin *bus.Admin) error {
		if err := a.checkShards(admin); err != nil {
			return err
		}
		return f(admin)
	})
}

// withAdmins runs f with an operator's handle on each shard of --shards
// under --root (the root itself for one shard), in shard order, and closes
// them.
func (a *app) withAdmins(f func([]*bus.Admin) error) error {
	var admins []*bus.Admin
	defer func() {
		for _, admin := range admins {
			admin.Close()
		}
	}()
	for k := range a.shards {
		root, err := subjects.ShardRoot(a.root, k, a.shards)
		if err != nil {
			return usageError{fmt.Errorf("--shards: %w", err)}
		}
		admin, err := a.connectAdmin(root)
		if err != nil {
			return err
		}
		admins = append(admins, admin)
		if err := a.checkShards(admin); err != nil {
			return err
		}
	}
	return f(admins)
}

// checkShards refuses, with --shards above 1, a shard the operator
// provisioned as one of another number of shards (bus.Admin.CheckShards).
func (a *app) checkShards(admin *bus.Admin) error {
	if a.shards == 1 {
		return nil
	}
	return admin.CheckShards(context.Background(), a.shards)
}

// withAdminOn runs f with an operator's handle under root and closes it.
func (a *app) withAdminOn(root string, f func(*bus.Admin) error) error {
	admin, err := a.connectAdmin(root)
	if err != nil {
		return err
	}
	defer admin.Close()
	return f(admin)
}

// connectAdmin connects an operator's handle under root with the
// connection flags; its background errors become warnings.
func (a *app) connectAdmin(root string) (*bus.Admin, error) {
	natsOpts, err := a.natsOptions()
	if err != nil {
		return nil, err
	}
	admin, err := bus.ConnectAdmin(a.server, bus.WithNATSOptions(natsOpts...), bus.WithRoot(root), a.warnErrors())
	if errors.Is(err, bus.ErrInvalidOption) {
		return nil, usageError{err}
	}
	return admin, err
}

// onEveryShard calls read with each of admins at once and returns what each
// returned, in their order, or the first error, naming its shard when
// there are several.
func onEveryShard[T any](admins []*bus.Admin, read func(*bus.Admin) (T, error)) ([]T, error) {
	out := make([]T, len(admins))
	errs := make([]error, len(admins))
	var wg sync.WaitGroup
	for k, admin := range admins {
		wg.Go(func() { out[k], errs[k] = read(admin) })
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			return nil, onShard(admins, k, err)
		}
	}
	return out, nil
}

// watchEveryShard runs watch with each of admins at once (a method
// expression such as (*bus.Admin).WatchPresence), with f called for one
// change at a time, until ctx ends or a watch fails, which ends
// the others and returns its error, naming its shard when there are
// several.
func watchEveryShard[T any](ctx context.Context, admins []*bus.Admin, f func(T), watch func(*bus.Admin, context.Context, func(T)) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	one := func(v T) {
		mu.Lock()
		defer mu.Unlock()
		f(v)
	}
	errs := make([]error, len(admins))
	var wg sync.WaitGroup
	for k, admin := range admins {
		wg.Go(func() {
			if errs[k] = watch(admin, ctx, one); errs[k] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	// The first to fail, not one the failure ended.
	for k, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return onShard(admins, k, err)
		}
	}
	for k, err := range errs {
		if err != nil {
			return onShard(admins, k, err)
		}
	}
	return nil
}

// onShard names the shard of admins[k] in err when there are several.
func onShard(admins []*bus.Admin, k int, err error) error {
	if len(admins) == 1 {
		return err
	}
	return fmt.Errorf("shard %s: %w", admins[k].Subjects().Root(), err)
}

// recordsOnShards returns the records read reads with an operator's handle
// on each shard of --shards under --root (the root itself for one shard),
// in shard order; a shard without any (bus.ErrNoStatus) adds none. It
// returns bus.ErrNoStatus when no shard has any.
func (a *app) recordsOnShards(read func(*bus.Admin) ([]bus.Status, error)) ([]bus.Status, error) {
	var out []bus.Status
	err := a.withAdmins(func(admins []*bus.Admin) error {
		found, err := onEveryShard(admins, func(admin *bus.Admin) ([]bus.Status, error) {
			sts, err := read(admin)
			if errors.Is(err, bus.ErrNoStatus) {
				return nil, nil
			}
			return sts, err
		})
		// A broadcast is on every shard, and so is its sender's record:
		// listed once, the first shard's.
		type record struct{ id, from, to string }
		seen := make(map[record]bool)
		for _, sts := range found {
			for _, st := range sts {
				if r := (record{st.ID, st.From, st.To}); !seen[r] {
					seen[r] = true
					out = append(out, st)
				}
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, bus.ErrNoStatus
	}
	return out, nil
}
