package benchmark

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, embeddedtest.IgnoreServerGoroutines()...)
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr error
	}{
		{name: "zero is every default", cfg: Config{}},
		{name: "smallest", cfg: Config{Messages: MinMessages, Size: MinSize, Agents: 1, Rate: 0.5}},
		{name: "subset", cfg: Config{Only: []string{"sync", "priority"}}},
		{name: "one message", cfg: Config{Messages: 1}, wantErr: ErrInvalidConfig},
		{name: "negative messages", cfg: Config{Messages: -1}, wantErr: ErrInvalidConfig},
		{name: "payload too small for the stamp", cfg: Config{Size: MinSize - 1}, wantErr: ErrInvalidConfig},
		{name: "negative agents", cfg: Config{Agents: -1}, wantErr: ErrInvalidConfig},
		{name: "negative rate", cfg: Config{Rate: -1}, wantErr: ErrInvalidConfig},
		{name: "unknown scenario", cfg: Config{Only: []string{"sync", "bogus"}}, wantErr: ErrInvalidConfig},
		{name: "rounds", cfg: Config{Rounds: MaxRounds}},
		{name: "negative rounds", cfg: Config{Rounds: -1}, wantErr: ErrInvalidConfig},
		{name: "too many rounds", cfg: Config{Rounds: MaxRounds + 1}, wantErr: ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); !errors.Is(err, tt.wantErr) {
				t.Errorf("Validate() = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestRunWithoutDial(t *testing.T) {
	if _, err := Run(context.Background(), Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Run without Dial = %v, want %v", err, ErrInvalidConfig)
	}
}

func TestEndToEndMessages(t *testing.T) {
	tests := []struct {
		messages int
		rate     float64
		want     int
	}{
		{messages: 10_000, rate: 1000, want: 5000}, // bounded by EndToEndDuration
		{messages: 200, rate: 1000, want: 200},
		{messages: 10_000, rate: 0.1, want: MinMessages},
	}
	for _, tt := range tests {
		c := Config{Messages: tt.messages, Rate: tt.rate}
		if got := c.endToEndMessages(); got != tt.want {
			t.Errorf("endToEndMessages(messages %d, rate %v) = %d, want %d", tt.messages, tt.rate, got, tt.want)
		}
	}
}

// TestRawConsumersMirrorTheBus checks that the raw side of the setup
// scenario creates exactly the consumers package subjects names for an
// agent, with the bus's settings.
func TestRawConsumersMirrorTheBus(t *testing.T) {
	s, err := subjects.New("bench-test")
	if err != nil {
		t.Fatal(err)
	}
	want, err := s.Consumers("agent-1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := rawConsumers(s, "agent-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("rawConsumers made %d consumers, subjects names %d", len(got), len(want))
	}
	for i, c := range got {
		if c.Durable != want[i].Name || c.FilterSubject != want[i].Filter {
			t.Errorf("consumer %d = %s on %s, want %s on %s", i, c.Durable, c.FilterSubject, want[i].Name, want[i].Filter)
		}
	}
	if _, err := rawConsumers(s, "*"); !errors.Is(err, subjects.ErrInvalidAgentID) {
		t.Errorf("rawConsumers of %q = %v, want %v", "*", err, subjects.ErrInvalidAgentID)
	}
}

func TestTally(t *testing.T) {
	tl := newTally(3)
	for _, v := range []int64{5, 4, 3, 2} { // the fourth is a redelivery
		tl.add(v)
	}
	if err := tl.wait(context.Background()); err != nil {
		t.Fatalf("wait after 3 of 3 calls: %v", err)
	}
	if got := tl.snapshot(); !slices.Equal(got, []int64{5, 4, 3}) {
		t.Errorf("values = %v, want [5 4 3]", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := newTally(3).wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("wait with a cancelled context = %v, want %v", err, context.Canceled)
	}
}

func TestStamp(t *testing.T) {
	epoch := time.Now()
	p := stamp(epoch, 16)
	if len(p) != 16 {
		t.Fatalf("stamp made %d bytes, want 16", len(p))
	}
	if d := since(epoch, p); d < 0 {
		t.Errorf("since(stamp) = %v, want >= 0", d)
	}
	if d := since(epoch, []byte{1, 2, 3}); d != 0 {
		t.Errorf("since(short payload) = %v, want 0", d)
	}
}

// TestMirrored: each side measures half the messages, the odd one in the
// second half, in the order A B C then C B A; an error stops the run and
// names its side.
func TestMirrored(t *testing.T) {
	var calls []string
	side := func(name string) func(k int) (int, error) {
		return func(k int) (int, error) {
			calls = append(calls, fmt.Sprintf("%s%d", name, k))
			return k, nil
		}
	}
	got, err := mirrored(7, sideNames, side("a"), side("b"), side("c"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a3", "b3", "c3", "c4", "b4", "a4"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if want := [][2]int{{3, 4}, {3, 4}, {3, 4}}; !slices.Equal(got, want) {
		t.Errorf("measures %v, want %v", got, want)
	}
	failed := errors.New("boom")
	_, err = mirrored(4, sideNames, side("a"), func(int) (int, error) { return 0, failed })
	if !errors.Is(err, failed) || !strings.HasPrefix(err.Error(), "raw: ") {
		t.Errorf("error %v, want boom named raw", err)
	}
}

// spinCPU works until the process has used d more CPU time: by the
// process's CPU, not the clock, so that a busy machine cannot make it use
// less.
func spinCPU(d time.Duration) {
	start, _ := processCPU()
	for used := time.Duration(0); used < d; {
		now, _ := processCPU()
		used = now - start
	}
}

// TestBalancedCPU: a side that uses the CPU for each message shows at
// least that CPU per message, and one that waits far less; the rates count
// both halves of each side. The spinning side counts the process's CPU,
// not the clock, so a busy machine cannot make it use less.
func TestBalancedCPU(t *testing.T) {
	if _, ok := processCPU(); !ok {
		t.Fatalf("processCPU not read on %s", runtime.GOOS)
	}
	const n, each = 10, 2 * time.Millisecond
	spin := func(k int) error {
		spinCPU(time.Duration(k) * each)
		return nil
	}
	wait := func(k int) error {
		time.Sleep(time.Duration(k) * each)
		return nil
	}
	rates, cpu, err := balanced(n, spin, wait, wait)
	if err != nil {
		t.Fatal(err)
	}
	if len(cpu) != 3 || cpu[0] < float64(each.Microseconds()) || cpu[1] >= cpu[0]/2 || cpu[2] >= cpu[0]/2 {
		t.Errorf("CPU per message %v µs: want the spinning side's at least %d µs and the waiting ones' under half of it", cpu, each.Microseconds())
	}
	// A waiting side took at least n×each over its two halves, so its rate
	// is at most one message per each; counting one half only, it would be
	// about twice that.
	if rates[0] <= 0 {
		t.Errorf("spinning side: %.0f msg/s", rates[0])
	}
	for i, r := range rates[1:] {
		if r <= 0 || r > float64(time.Second/each) {
			t.Errorf("waiting side %d: %.0f msg/s, want at most %.0f", i+1, r, float64(time.Second/each))
		}
	}
}

// TestDrainedCPU: a draining side's CPU per message counts from its first
// handled message to its last, not the work before (publishing the
// backlog, subscribing): a side that spins between its calls shows that
// CPU per message and not the larger amount it spun before the first, and
// one that waits far less.
func TestDrainedCPU(t *testing.T) {
	if _, ok := processCPU(); !ok {
		t.Fatalf("processCPU not read on %s", runtime.GOOS)
	}
	const n, each, before = 10, 2 * time.Millisecond, 20 * time.Millisecond
	spin := func(k int) (*tally, error) {
		tl := newTally(k)
		spinCPU(before)
		for i := range k {
			tl.add(0)
			if i < k-1 {
				spinCPU(each)
			}
		}
		return tl, nil
	}
	wait := func(k int) (*tally, error) {
		tl := newTally(k)
		for i := range k {
			tl.add(0)
			if i < k-1 {
				time.Sleep(each)
			}
		}
		return tl, nil
	}
	rates, cpu, err := drained(n, spin, wait, wait)
	if err != nil {
		t.Fatal(err)
	}
	// Each half of the spinning side spun (k-1)×each between its first
	// call and its last, over k-1 counted calls; the 20 ms before its
	// first call would add 5 ms per message.
	if len(cpu) != 3 || cpu[0] < float64(each.Microseconds()) || cpu[0] >= float64(2*each.Microseconds()) {
		t.Errorf("spinning side: %v µs per message, want at least %d and under %d", cpu, each.Microseconds(), 2*each.Microseconds())
	}
	if len(cpu) == 3 && (cpu[1] >= cpu[0]/2 || cpu[2] >= cpu[0]/2) {
		t.Errorf("waiting sides: %v µs per message, want under half the spinning side's", cpu)
	}
	for i, r := range rates {
		if r <= 0 {
			t.Errorf("side %d: %.0f msg/s", i, r)
		}
	}
}

// TestInterleaved: every side is called once per round, the order turning
// by one each round, and each side's durations come back in its own slot;
// an error names its side and message.
func TestInterleaved(t *testing.T) {
	var calls []string
	side := func(name string) func(i int) error {
		return func(i int) error {
			calls = append(calls, fmt.Sprintf("%s%d", name, i))
			return nil
		}
	}
	lat, err := interleaved(3, side("a"), side("b"), side("c"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a0", "b0", "c0", "b1", "c1", "a1", "c2", "a2", "b2"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if len(lat) != 3 || len(lat[0]) != 3 || len(lat[2]) != 3 {
		t.Errorf("durations %v, want three sides of three", lat)
	}
	failed := errors.New("boom")
	_, err = interleaved(2, side("a"), side("b"), func(i int) error {
		if i == 1 {
			return failed
		}
		return nil
	})
	if !errors.Is(err, failed) || !strings.HasPrefix(err.Error(), "raw+headers: message 1: ") {
		t.Errorf("error %v, want boom named raw+headers, message 1", err)
	}
}

// TestMedianRound: the round reported is the one whose headline ratio is
// the median (the lower middle of an even number), rounds with an
// undefined ratio are passed over, and the spread covers the defined ones.
func TestMedianRound(t *testing.T) {
	consume := func(bus, raw, rawHeaders float64) *Report {
		th := &Throughput{BusMsgsPerSec: bus, RawMsgsPerSec: raw, RatioBusRaw: Ratio(bus, raw)}
		if rawHeaders >= 0 {
			th.RawHeadersMsgsPerSec, th.RatioBusRawHeaders = &rawHeaders, Ratio(bus, rawHeaders)
		}
		return &Report{ConsumeDefaults: th}
	}
	rounds := []*Report{consume(90, 200, 100), consume(70, 200, 100), consume(80, 200, 100), consume(95, 200, 100)}
	got, sp := medianRound("consume-defaults", rounds)
	if got != rounds[2] {
		t.Errorf("median round %+v, want the third (0.80)", got.ConsumeDefaults)
	}
	if sp == nil || sp.Rounds != 4 || sp.Ratio != "bus/raw+headers" || sp.Min != 0.7 || sp.Median != 0.8 || sp.Max != 0.95 {
		t.Errorf("spread %+v", sp)
	}

	// Without a raw+headers side the headline is bus/raw; a round whose
	// raw figure is zero has no ratio and is passed over.
	rounds = []*Report{consume(50, 100, -1), consume(50, 0, -1), consume(60, 100, -1)}
	got, sp = medianRound("consume-defaults", rounds)
	if got != rounds[0] || sp == nil || sp.Ratio != "bus/raw" || sp.Rounds != 3 || sp.Min != 0.5 || sp.Max != 0.6 {
		t.Errorf("median round %+v, spread %+v", got.ConsumeDefaults, sp)
	}

	// No defined ratio: the last round, no spread.
	rounds = []*Report{{Priority: &Inversions{}}, {Priority: &Inversions{}}}
	if got, sp = medianRound("priority", rounds); got != rounds[1] || sp != nil {
		t.Errorf("undefined ratios: round %p (want %p), spread %+v", got, rounds[1], sp)
	}

	// take copies the scenario's figures, and only them.
	var r Report
	for _, s := range Scenarios() {
		r.take(s.Name, &Report{Async: &Throughput{}, AsyncUntracked: &Throughput{}, Sync: &Latency{}, Consume: &Throughput{},
			ConsumeDefaults: &Throughput{}, ConsumeUntracked: &Throughput{}, Request: &Latency{}, E2E: &Latency{},
			Priority: &Inversions{}, Setup: &SetupTime{}})
	}
	if r.Async == nil || r.AsyncUntracked == nil || r.Sync == nil || r.Consume == nil || r.ConsumeDefaults == nil ||
		r.ConsumeUntracked == nil || r.Request == nil || r.E2E == nil || r.Priority == nil || r.Setup == nil {
		t.Errorf("take left a scenario out: %+v", r)
	}
}
