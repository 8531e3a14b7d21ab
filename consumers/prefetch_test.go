package consumers

import (
	"testing"
	"time"
)

// TestAdaptivePrefetch: without a set prefetch a lane holds the
// concurrency until a handler has returned, then what the handlers start
// in PrefetchWindow at their average speed, between the concurrency and
// MaxPrefetch; a set prefetch is used as it is.
func TestAdaptivePrefetch(t *testing.T) {
	d := &Dispatcher{opts: Options{Concurrency: 2}}
	if got := d.prefetch(); got != 2 {
		t.Errorf("before any handler returned: %d, want the concurrency 2", got)
	}
	d.observe(10 * time.Microsecond)
	if got := d.prefetch(); got != MaxPrefetch {
		t.Errorf("fast handlers: %d, want MaxPrefetch %d", got, MaxPrefetch)
	}
	for range 100 {
		d.observe(10 * time.Millisecond)
	}
	// 2 handlers x 100ms / ~10ms each.
	if got := d.prefetch(); got < 19 || got > 21 {
		t.Errorf("10ms handlers: %d, want about 20", got)
	}
	for range 100 {
		d.observe(5 * time.Second)
	}
	if got := d.prefetch(); got != 2 {
		t.Errorf("slow handlers: %d, want the concurrency 2", got)
	}
	d.opts.Prefetch = 7
	if got := d.prefetch(); got != 7 {
		t.Errorf("set prefetch: %d, want 7", got)
	}
}
