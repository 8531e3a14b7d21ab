package bus

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestIsJetStreamControlHeader: every header nats-server 2.15 acts on when
// a message is published, in any case, and none of those it only sets on
// what it sends.
func TestIsJetStreamControlHeader(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"Nats-Msg-Id", true},
		{"Nats-Expected-Stream", true},
		{"Nats-Expected-Last-Sequence", true},
		{"Nats-Expected-Last-Subject-Sequence", true},
		{"Nats-Expected-Last-Subject-Sequence-Subject", true},
		{"Nats-Expected-Last-Msg-Id", true},
		{"Nats-TTL", true},
		{"Nats-Rollup", true},
		{"Nats-Incr", true},
		{"Nats-Counter-Sources", true},
		{"Nats-Batch-Id", true},
		{"Nats-Batch-Sequence", true},
		{"Nats-Batch-Commit", true},
		{"Nats-Schedule", true},
		{"Nats-Schedule-Time-Zone", true},
		{"Nats-Schedule-TTL", true},
		{"Nats-Schedule-Rollup", true},
		{"Nats-Schedule-Target", true},
		{"Nats-Schedule-Source", true},
		{"Nats-Schedule-Next", true},
		{"Nats-Scheduler", true},
		{"Nats-Stream-Source", true},
		{"Nats-Marker-Reason", true},
		{"Nats-Required-Api-Level", true},
		{"Nats-Trace-Dest", true},
		{"Nats-Trace-Only", true},
		{"Nats-Trace-Hop", true},
		{"Nats-Trace-Origin-Account", true},
		{"nats-expected-stream", true},
		{"NATS-TTL", true},
		{"nAtS-bAtCh-iD", true},
		{"Nats-Expected-Something-New", true},

		{"", false},
		{"Nats-", false},
		{"Nats-Expected", false},
		{"Nats-Stream", false},
		{"Nats-Sequence", false},
		{"Nats-Time-Stamp", false},
		{"Nats-Subject", false},
		{"Nats-Last-Sequence", false},
		{"Nats-Num-Pending", false},
		{"Nats-Request-Info", false},
		{"Nats-TTL-Extra", false},
		{"X-Nats-TTL", false},
		{"traceparent", false},
		{"ce-id", false},
		{"Content-Type", false},
		{HeaderDeadLetterReason, false},
		{HeaderDeadLetterOrigPrefix + "Nats-TTL", false},
	}
	for _, tt := range tests {
		if got := isJetStreamControlHeader(tt.name); got != tt.want {
			t.Errorf("isJetStreamControlHeader(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// parseHeader reads "key:value" lines into a header, keeping the keys as
// they are.
func parseHeader(s string) nats.Header {
	h := nats.Header{}
	for line := range strings.SplitSeq(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			h[k] = append(h[k], v)
		}
	}
	return h
}

// FuzzDeadLetterHeaders: a dead letter's headers never carry a header the
// server acts on, keep every other header of the original as it was, and
// keep each control header but Nats-Msg-Id under
// HeaderDeadLetterOrigPrefix.
func FuzzDeadLetterHeaders(f *testing.F) {
	for _, h := range append(append([]string{}, jetStreamControlHeaders...), jetStreamControlPrefixes...) {
		f.Add(h + ":1\nce-id:x")
		f.Add(strings.ToLower(h) + ":v\n" + strings.ToUpper(h) + ":w")
	}
	f.Add("Nats-Expected-Stream:AGENTBUS\nNats-Expected-Last-Sequence:7\nNats-Msg-Id:m1\ntraceparent:00-x")
	f.Add("Nats-TTL:1h\n" + HeaderDeadLetterOrigPrefix + "Nats-TTL:forged")
	f.Add(":\n:x\nNats-:y")
	f.Fuzz(func(t *testing.T, s string) {
		orig := parseHeader(s)
		h := deadLetterHeader(orig)
		for k := range h {
			if isJetStreamControlHeader(k) {
				t.Errorf("dead letter keeps control header %q", k)
			}
		}
		for k, v := range orig {
			switch {
			case strings.EqualFold(k, "Nats-Msg-Id"):
				if _, ok := h[k]; ok {
					t.Errorf("dead letter keeps the original's %q", k)
				}
			case isJetStreamControlHeader(k):
				if got := h[HeaderDeadLetterOrigPrefix+k]; fmt.Sprint(got) != fmt.Sprint(v) {
					t.Errorf("%s%s = %q, want %q", HeaderDeadLetterOrigPrefix, k, got, v)
				}
			default:
				c, renamed := strings.CutPrefix(k, HeaderDeadLetterOrigPrefix)
				if _, clash := orig[c]; renamed && clash && isJetStreamControlHeader(c) && !strings.EqualFold(c, "Nats-Msg-Id") {
					continue // the original's control header wins
				}
				if got := h[k]; fmt.Sprint(got) != fmt.Sprint(v) {
					t.Errorf("%s = %q, want the original's %q", k, got, v)
				}
			}
		}
	})
}
