package bus_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestStreamConfigValidatesDedupBound(t *testing.T) {
	tests := []struct {
		name    string
		cfg     bus.StreamConfig
		wantErr error
	}{
		{name: "unstated", cfg: bus.StreamConfig{}},
		{name: "rate and budget", cfg: bus.StreamConfig{PeakPublishRate: 100, DedupMemoryBudget: 1 << 30}},
		{name: "negative rate", cfg: bus.StreamConfig{PeakPublishRate: -1}, wantErr: bus.ErrInvalidOption},
		{name: "negative budget", cfg: bus.StreamConfig{DedupMemoryBudget: -1}, wantErr: bus.ErrInvalidOption},
		{name: "window under the server's least", cfg: bus.StreamConfig{DuplicateWindow: 50 * time.Millisecond}, wantErr: bus.ErrInvalidOption},
		{name: "window at the server's least", cfg: bus.StreamConfig{DuplicateWindow: 100 * time.Millisecond}},
		// Over budget is Provision's refusal, not an invalid config.
		{name: "over budget", cfg: bus.StreamConfig{PeakPublishRate: 50_000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); !errors.Is(err, tt.wantErr) {
				t.Errorf("Validate() = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestStreamConfigDedupMemory(t *testing.T) {
	const perID = bus.DedupBytesPerID
	tests := []struct {
		name    string
		cfg     bus.StreamConfig
		want    int64
		wantErr error
	}{
		{name: "rate unstated", cfg: bus.StreamConfig{}, want: 0},
		{name: "100/s for 1h", cfg: bus.StreamConfig{PeakPublishRate: 100}, want: 100 * 3600 * perID},
		{name: "248/s for 1h fits the default", cfg: bus.StreamConfig{PeakPublishRate: 248}, want: 248 * 3600 * perID},
		{name: "249/s for 1h passes the default", cfg: bus.StreamConfig{PeakPublishRate: 249}, want: 249 * 3600 * perID, wantErr: bus.ErrDedupOverBudget},
		{name: "50k/s for 1h", cfg: bus.StreamConfig{PeakPublishRate: 50_000}, want: 50_000 * 3600 * perID, wantErr: bus.ErrDedupOverBudget},
		{name: "50k/s for 17s", cfg: bus.StreamConfig{PeakPublishRate: 50_000, DuplicateWindow: 17 * time.Second}, want: 50_000 * 17 * perID},
		{name: "50k/s for 1h with 64 GiB", cfg: bus.StreamConfig{PeakPublishRate: 50_000, DedupMemoryBudget: 64 << 30}, want: 50_000 * 3600 * perID},
		{name: "500ms window", cfg: bus.StreamConfig{PeakPublishRate: 1000, DuplicateWindow: 500 * time.Millisecond}, want: 500 * perID},
		{name: "saturates", cfg: bus.StreamConfig{PeakPublishRate: math.MaxInt, DuplicateWindow: 30 * 24 * time.Hour}, want: math.MaxInt64, wantErr: bus.ErrDedupOverBudget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.DedupMemory(); got != tt.want {
				t.Errorf("DedupMemory() = %d, want %d", got, tt.want)
			}
			if err := tt.cfg.CheckDedupMemory(); !errors.Is(err, tt.wantErr) {
				t.Errorf("CheckDedupMemory() = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestDedupBudgetErrorSuggestsAWindow(t *testing.T) {
	err := bus.StreamConfig{PeakPublishRate: 50_000}.CheckDedupMemory()
	var be *bus.DedupBudgetError
	if !errors.As(err, &be) {
		t.Fatalf("CheckDedupMemory() = %v, want a *DedupBudgetError", err)
	}
	// 256 MiB / 300 B / 50,000 msg/s = 17.9 s.
	want := bus.DedupBudgetError{Rate: 50_000, Window: time.Hour, Estimate: 50_000 * 3600 * bus.DedupBytesPerID,
		Budget: bus.DefaultDedupMemoryBudget, MaxWindow: 17 * time.Second}
	if *be != want {
		t.Errorf("error %+v, want %+v", *be, want)
	}
	fits := bus.StreamConfig{PeakPublishRate: be.Rate, DuplicateWindow: be.MaxWindow}
	if err := fits.CheckDedupMemory(); err != nil {
		t.Errorf("the suggested window %v: %v", be.MaxWindow, err)
	}

	tests := []struct {
		name string
		cfg  bus.StreamConfig
		want time.Duration
	}{
		// 256 MiB / 300 B / 2,000,000 msg/s = 447 ms.
		{name: "tenths below a second", cfg: bus.StreamConfig{PeakPublishRate: 2_000_000}, want: 400 * time.Millisecond},
		// 256 MiB / 300 B / 10,000,000 msg/s = 89 ms.
		{name: "nothing fits", cfg: bus.StreamConfig{PeakPublishRate: 10_000_000}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var be *bus.DedupBudgetError
			if err := tt.cfg.CheckDedupMemory(); !errors.As(err, &be) {
				t.Fatalf("CheckDedupMemory() = %v, want a *DedupBudgetError", err)
			}
			if be.MaxWindow != tt.want {
				t.Errorf("MaxWindow %v, want %v", be.MaxWindow, tt.want)
			}
		})
	}
}

func TestStreamConfigWarnings(t *testing.T) {
	tests := []struct {
		name string
		cfg  bus.StreamConfig
		want int
	}{
		{name: "rate unstated", cfg: bus.StreamConfig{}, want: 1},
		{name: "rate stated", cfg: bus.StreamConfig{PeakPublishRate: 100}, want: 0},
		// Over budget is an error from CheckDedupMemory, not a warning.
		{name: "over budget", cfg: bus.StreamConfig{PeakPublishRate: 50_000}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.Warnings(); len(got) != tt.want {
				t.Errorf("Warnings() = %q, want %d", got, tt.want)
			}
		})
	}
}

// TestProvisionRefusesDedupOverBudget: Provision refuses a window over the
// budget before it creates anything, and takes it once the budget is
// raised.
func TestProvisionRefusesDedupOverBudget(t *testing.T) {
	s := embeddedtest.RunServer(t)
	nc := embeddedtest.Connect(t, s)
	ctx := testContext(t)
	cfg := bus.StreamConfig{PeakPublishRate: 50_000}
	if _, err := newAdmin(t, nc).Provision(ctx, cfg); !errors.Is(err, bus.ErrDedupOverBudget) {
		t.Fatalf("Provision over budget = %v, want ErrDedupOverBudget", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, "AGENTBUS"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream after the refusal: %v, want ErrStreamNotFound", err)
	}
	cfg.DedupMemoryBudget = cfg.DedupMemory()
	info, err := newAdmin(t, nc).Provision(ctx, cfg)
	if err != nil {
		t.Fatalf("Provision with the budget raised: %v", err)
	}
	if info.Config.Duplicates != time.Hour {
		t.Errorf("duplicate window %v, want 1h", info.Config.Duplicates)
	}
}
