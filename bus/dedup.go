package bus

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// DedupBytesPerID is the memory, in bytes, one message ID of the duplicate
// window takes on each server that holds a replica of the stream, under a
// steady publish rate, for the bus's IDs (36-byte UUID strings). The
// server keeps every ID of the window in a Go map and an array (its
// stream.go: ddmap, ddarr); docs/performance.md ("Duplicate window and
// memory") measures 124 B per ID right after the IDs arrive and explains
// why a sliding window takes up to 300 B: the array keeps forgotten
// entries until it is compacted, at three times its live length. Longer
// IDs cost more, up to three times their length past 36 bytes.
const DedupBytesPerID = 300

// minDuplicateWindow is the shortest duplicate window the server takes
// other than zero.
const minDuplicateWindow = 100 * time.Millisecond

// DefaultDedupMemoryBudget is StreamConfig.DedupMemoryBudget's default,
// 256 MiB per server: an eighth of a 2 GiB server, which holds the 1 h
// window at about 248 messages per second.
const DefaultDedupMemoryBudget = 256 << 20

// ErrDedupOverBudget is wrapped by a *DedupBudgetError: the duplicate
// window at the stated peak publish rate needs more server memory than
// the budget.
var ErrDedupOverBudget = errors.New("bus: duplicate window over its memory budget")

// DedupBudgetError reports a duplicate window whose memory at the stated
// peak rate passes the budget. errors.Is(err, ErrDedupOverBudget) holds.
// Shorten the window to MaxWindow or less, or raise the budget to
// Estimate or more, to accept it.
type DedupBudgetError struct {
	Rate     int           // peak publish rate, messages per second
	Window   time.Duration // duplicate window
	Estimate int64         // memory the window needs on each server, bytes
	Budget   int64         // memory budget on each server, bytes
	// MaxWindow is the longest window within Budget at Rate, in whole
	// seconds, or tenths below one; zero if not even the server's least
	// window, 100 ms, fits.
	MaxWindow time.Duration
}

func (e *DedupBudgetError) Error() string {
	fits := "no window of 100ms or more fits"
	if e.MaxWindow > 0 {
		fits = "the longest window within it is " + roundDuration(e.MaxWindow)
	}
	return fmt.Sprintf("bus: duplicate window %s at %d msg/s needs about %s on each server, over its memory budget of %s; %s",
		roundDuration(e.Window), e.Rate, formatBytes(e.Estimate), formatBytes(e.Budget), fits)
}

// Is reports whether target is ErrDedupOverBudget.
func (e *DedupBudgetError) Is(target error) bool { return target == ErrDedupOverBudget }

// DedupMemory returns the memory, in bytes, the stream's duplicate window
// takes on each server that holds a replica at c.PeakPublishRate:
// rate × window (in seconds) × DedupBytesPerID. It returns 0 when the rate
// is not stated.
func (c StreamConfig) DedupMemory() int64 {
	ids := float64(c.PeakPublishRate) * orDefault(c.DuplicateWindow, DefaultDuplicateWindow).Seconds()
	return saturate(ids * DedupBytesPerID)
}

// CheckDedupMemory returns a *DedupBudgetError if DedupMemory passes the
// budget (c.DedupMemoryBudget, or DefaultDedupMemoryBudget), and nil
// otherwise, including when c.PeakPublishRate is not stated. Provision
// calls it before it touches the server.
func (c StreamConfig) CheckDedupMemory() error {
	est, budget := c.DedupMemory(), orDefault(c.DedupMemoryBudget, DefaultDedupMemoryBudget)
	if c.PeakPublishRate <= 0 || est <= budget {
		return nil
	}
	maxWindow := time.Duration(float64(budget) / DedupBytesPerID / float64(c.PeakPublishRate) * float64(time.Second))
	if maxWindow >= time.Second {
		maxWindow = maxWindow.Truncate(time.Second)
	} else {
		maxWindow = maxWindow.Truncate(minDuplicateWindow)
	}
	return &DedupBudgetError{
		Rate:      c.PeakPublishRate,
		Window:    orDefault(c.DuplicateWindow, DefaultDuplicateWindow),
		Estimate:  est,
		Budget:    budget,
		MaxWindow: maxWindow,
	}
}

// Warnings returns what an operator should know about c that Provision
// accepts, one sentence each, for a command to print; the library prints
// nothing. Today that is a duplicate window whose memory is not bounded
// because c.PeakPublishRate is not stated.
func (c StreamConfig) Warnings() []string {
	if c.PeakPublishRate != 0 {
		return nil
	}
	window := orDefault(c.DuplicateWindow, DefaultDuplicateWindow)
	per1000 := StreamConfig{DuplicateWindow: window, PeakPublishRate: 1000}.DedupMemory()
	return []string{fmt.Sprintf("duplicate window memory not bounded: no peak publish rate stated; the %s window keeps about %s of message IDs on each server per 1,000 msg/s",
		roundDuration(window), formatBytes(per1000))}
}

// saturate converts f to int64, at most math.MaxInt64.
func saturate(f float64) int64 {
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(f)
}

// formatBytes prints n in the largest binary unit that keeps it at least
// 1, with one decimal below 10: "256 MiB", "1.0 GiB", "50 GiB".
func formatBytes(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v < 10 {
		return fmt.Sprintf("%.1f %ciB", v, units[i])
	}
	return fmt.Sprintf("%.0f %ciB", v, units[i])
}

// roundDuration prints d as time.Duration does, to the second: a window
// and its limit are whole seconds or more.
func roundDuration(d time.Duration) string {
	return d.Round(time.Second).String()
}
