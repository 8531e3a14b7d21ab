package bus_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
)

func TestZZMultiProcessStress(t *testing.T) {
	s := newServer(t)
	agents := []string{"alpha", "beta"}
	handler := func(ctx context.Context, d *bus.Delivery) error {
		switch d.Type {
		case "ECHO":
			if rand.IntN(3) == 0 {
				if err := d.Progress(ctx, bus.Progress{Message: "x"}); err != nil {
					return err
				}
			}
			_, err := d.Reply(ctx, bus.Message{Type: "R", Data: d.Data})
			return err
		case "SLOW":
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(rand.IntN(300)) * time.Millisecond):
			}
			_, err := d.Reply(ctx, bus.Message{Type: "R"})
			return err
		}
		return nil
	}
	var mu sync.Mutex
	procs := map[string][]*bus.Bus{}
	start := func(agent string) *bus.Bus {
		b := newBus(t, s, agent)
		if err := b.Register(context.Background(), bus.AgentCard{}); err != nil {
			t.Fatal(err)
		}
		subscribe(t, b, handler)
		if err := b.JoinGroup(context.Background(), "crew"); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, a := range agents {
		procs[a] = []*bus.Bus{start(a), start(a)}
	}
	pick := func(agent string) *bus.Bus {
		mu.Lock()
		defer mu.Unlock()
		ps := procs[agent]
		return ps[rand.IntN(len(ps))]
	}
	var calls, failures atomic.Int64
	var failMu sync.Mutex
	failKinds := map[string]int{}
	fail := func(what string, err error) {
		failures.Add(1)
		failMu.Lock()
		failKinds[what+": "+err.Error()]++
		failMu.Unlock()
	}
	deadline := time.Now().Add(40 * time.Second)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				from := agents[g%2]
				to := agents[(g+1)%2]
				b := pick(from)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				calls.Add(1)
				switch rand.IntN(6) {
				case 0, 1:
					d, err := b.Request(ctx, bus.Message{To: to, Type: "ECHO", Data: []byte("x")}, bus.OnProgress(func(*bus.Delivery) {}))
					if err != nil && !errors.Is(err, bus.ErrClosed) {
						fail("request", err)
					} else if err == nil && string(d.Data) != "x" {
						fail("request", fmt.Errorf("data %q", d.Data))
					}
				case 2:
					id := fmt.Sprintf("slow-%d-%d", g, rand.Int())
					go func() {
						time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
						c, cc := context.WithTimeout(context.Background(), 5*time.Second)
						defer cc()
						pick(from).Cancel(c, id)
					}()
					_, err := b.Request(ctx, bus.Message{ID: id, To: to, Type: "SLOW"})
					var ce *bus.CanceledError
					if err != nil && !errors.As(err, &ce) && !errors.Is(err, bus.ErrClosed) {
						fail("slow", err)
					}
				case 3:
					res, err := b.GatherGroup(ctx, "crew", bus.Message{Type: "ECHO", Data: []byte("x")})
					if err != nil && !errors.Is(err, bus.ErrClosed) {
						fail("gather", fmt.Errorf("%v (%+v)", err, res))
					}
				case 4:
					if _, err := b.Agents(ctx); err != nil && !errors.Is(err, bus.ErrClosed) {
						fail("agents", err)
					}
				case 5:
					// restart one process of a random agent
					a := agents[rand.IntN(2)]
					mu.Lock()
					i := rand.IntN(2)
					old := procs[a][i]
					mu.Unlock()
					nb := start(a)
					mu.Lock()
					procs[a][i] = nb
					mu.Unlock()
					old.Close()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	t.Logf("calls %d failures %d", calls.Load(), failures.Load())
	for k, v := range failKinds {
		t.Logf("%d × %s", v, k)
	}
}
