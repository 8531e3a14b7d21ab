package subjects

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// Fuzz inputs are truncated to these lengths. The longest valid name is
// 128 encoded bytes, root 64 bytes and subject 460 bytes, so longer inputs
// add no coverage, yet the fuzzer's minimizer, which is quadratic in the
// input length, stalls for many seconds on every long input it finds
// interesting. Truncating with min rather than returning early avoids a
// branch that would itself make every long input interesting.
const (
	maxFuzzName    = 256
	maxFuzzRoot    = 80
	maxFuzzSubject = 512
)

// FuzzToken checks the token encoding from both sides: every string survives
// EncodeToken and DecodeToken, DecodeToken never panics, and any token it
// accepts is the canonical encoding of what it decodes to. For strings that
// are valid IDs it also checks the consumer names against the server's rule
// and that ParseConsumer inverts them.
func FuzzToken(f *testing.F) {
	for _, s := range realIDs {
		f.Add(s)
		f.Add(EncodeToken(s))
	}
	for _, s := range []string{
		"", "*", "%", "%%", "%2", "%2a", "%2A", "%41", "%5F", "%FF", "%C0%AE",
		"%E6%97", "a\nb", "a\x00", "\xff", "%20 ", "%ED%A0%80", "%F4%90%80%80",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = s[:min(len(s), maxFuzzName)]
		tok := EncodeToken(s)
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; !unreserved(c) && c != '%' {
				t.Fatalf("EncodeToken(%q) = %q has byte %q", s, tok, c)
			}
		}
		if len(tok) != encodedLen(s) {
			t.Fatalf("len(EncodeToken(%q)) = %d, encodedLen = %d", s, len(tok), encodedLen(s))
		}
		got, err := DecodeToken(tok)
		switch {
		case s == "":
			if err == nil {
				t.Fatalf("DecodeToken(%q) accepted the empty token", tok)
			}
		case !utf8.ValidString(s):
			if !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("DecodeToken(EncodeToken(%q)) = %q, %v, want ErrInvalidToken for invalid UTF-8", s, got, err)
			}
		case err != nil || got != s:
			t.Fatalf("DecodeToken(EncodeToken(%q)) = %q, %v, want the input", s, got, err)
		}

		// s read as a token: decoding never panics, and accepts only
		// canonical tokens.
		if dec, err := DecodeToken(s); err == nil {
			if re := EncodeToken(dec); re != s {
				t.Fatalf("DecodeToken(%q) = %q, which encodes to %q", s, dec, re)
			}
		} else if !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("DecodeToken(%q) error = %v, want ErrInvalidToken", s, err)
		}

		if ValidateID(s) == nil {
			cs, err := Default().Consumers(s)
			if err != nil {
				t.Fatalf("Consumers(%q): %v", s, err)
			}
			for _, c := range cs {
				if err := checkServerName(c.Name); err != nil {
					t.Fatalf("Consumers(%q): %v", s, err)
				}
				if back, err := Default().ParseConsumer(c.Name); err != nil || back != c {
					t.Fatalf("ParseConsumer(%q) = %+v, %v, want %+v", c.Name, back, err, c)
				}
			}
		}
	})
}

// FuzzParseConsumer checks that ParseConsumer never panics and that every
// name it accepts is the name of that consumer in Consumers.
func FuzzParseConsumer(f *testing.F) {
	for _, s := range []string{
		"orchestrator_p1", "build%20orchestrator_b5", "a_p1_b1", "_p1", "a_p0", "a_b6",
		"a_x1", "%41_p1", "%2A_b1", "a.b_p1", "", "_", "a_p",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		name = name[:min(len(name), maxFuzzName)]
		c, err := Default().ParseConsumer(name)
		if err != nil {
			if !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("ParseConsumer(%q) error = %v, want ErrInvalidToken", name, err)
			}
			if c != (Consumer{}) {
				t.Fatalf("ParseConsumer(%q) = %+v with an error", name, c)
			}
			return
		}
		if c.Name != name {
			t.Fatalf("ParseConsumer(%q).Name = %q", name, c.Name)
		}
		cs, err := Default().Consumers(c.Agent)
		if err != nil || !slices.Contains(cs, c) {
			t.Fatalf("ParseConsumer(%q) = %+v, not among Consumers(%q) = %+v, %v", name, c, c.Agent, cs, err)
		}
	})
}

// FuzzParse checks that Parse never panics, that every subject it accepts
// is rebuilt exactly by Address.Subject and routed alike by Route. root is tried as a scheme root too,
// so multi-token and odd roots are covered.
func FuzzParse(f *testing.F) {
	seeds := []string{
		"agentbus.agent.reviewer.p2.orchestrator.review_request",
		"agentbus.agent.build%20orchestrator.p1.%40agent-cto.TASK_ASSIGNMENT",
		"agentbus.agent.%E6%97%A5%E6%9C%AC%E8%AA%9E.p5.a%2Eb.%2A",
		"agentbus.all.p3.orchestrator.shutdown",
		"agentbus.dlq.reviewer.orchestrator.review_request",
		"agentbus.dlq.%2A.orchestrator.shutdown",
		"agentbus.agent.%2A.p1.b.c",
		"agentbus.agent.%41.p1.b.c",
		"agentbus.agent.a.p0.b.c",
		"agentbus.agent.a.p6.b.c",
		"agentbus.all.px.b.c",
		"agentbus.all.p1.a%0Ab.c",
		"agentbus.agent..p1.b.c",
		"agentbus.agent.>",
		"agentbus.",
		"agentbus",
		"",
		"prod.bus-1.agent.a.p4.b.c",
		"agentbus.agent.a.p1.b.c.d.e.f",
		"agentbus.agent.a.p1.b.c.m-1.0123456789abcdef0123456789abcdef",
		"agentbus.agent.a.p1.b.c.=H" + strings.Repeat("0f", 32) + ".0123456789abcdef0123456789abcdef",
		"agentbus.agent.a.p1.b.c.a=2Eb.0123456789abcdef0123456789abcdef",
		"agentbus.dlq." + strings.Repeat("a", MaxTokenLen+1) + ".b.c",
	}
	for _, s := range seeds {
		f.Add("", s)
		f.Add("prod.bus-1", s)
	}
	f.Add("agentbus.agent", "agentbus.agent.agent.a.p1.b.c")
	f.Fuzz(func(t *testing.T, root, subject string) {
		root, subject = root[:min(len(root), maxFuzzRoot)], subject[:min(len(subject), maxFuzzSubject)]
		s, err := New(root)
		if err != nil {
			if !errors.Is(err, ErrInvalidRoot) {
				t.Fatalf("New(%q) error = %v, want ErrInvalidRoot", root, err)
			}
			s = Default()
		}
		a, err := s.Parse(subject)
		if err != nil {
			if !errors.Is(err, ErrInvalidSubject) {
				t.Fatalf("Parse(%q) error = %v, want ErrInvalidSubject", subject, err)
			}
			if a != (Address{}) {
				t.Fatalf("Parse(%q) = %+v with an error", subject, a)
			}
			return
		}
		back, err := a.Subject(s)
		if err != nil {
			t.Fatalf("Parse(%q) = %+v, whose Subject fails: %v", subject, a, err)
		}
		if back != subject {
			t.Fatalf("Parse(%q) = %+v, whose Subject is %q", subject, a, back)
		}
		// Route, which reads two tokens only, agrees with Parse on every
		// subject Parse accepts.
		wantKind, wantPriority := a.Kind, a.Priority
		if a.Kind == KindDeadLetter {
			wantKind, wantPriority = 0, 0
		}
		if kind, p := s.Route(subject); kind != wantKind || p != wantPriority {
			t.Fatalf("Route(%q) = %v, %d; Parse says %v, %d", subject, kind, p, wantKind, wantPriority)
		}
	})
}

// FuzzAddress checks the other direction: every address the builders accept
// parses back to itself, and the builders and Parse agree on what is valid.
func FuzzAddress(f *testing.F) {
	f.Add(uint8(KindDirect), "reviewer", "orchestrator", "review_request", 2)
	f.Add(uint8(KindDirect), "build orchestrator", "@agent-cto", "日本語", 1)
	f.Add(uint8(KindBroadcast), "*", "a.b", "a*b", 5)
	f.Add(uint8(KindDeadLetter), "*", "a>b", "%41", 0)
	f.Add(uint8(KindDeadLetter), "a\nb", "\xff", "", 9)
	f.Add(uint8(0), "", "", "", 0)
	f.Fuzz(func(t *testing.T, kind uint8, to, from, typ string, priority int) {
		to, from, typ = to[:min(len(to), maxFuzzName)], from[:min(len(from), maxFuzzName)], typ[:min(len(typ), maxFuzzName)]
		a := Address{Kind: Kind(kind), To: to, From: from, Type: typ, Priority: priority}
		s := Default()
		subj, err := a.Subject(s)
		if err != nil {
			return
		}
		got, err := s.Parse(subj)
		if err != nil || got != a {
			t.Fatalf("Parse(%q) = %+v, %v, want %+v", subj, got, err, a)
		}
	})
}
