package subjects

import "testing"

// Results are assigned to package variables so the compiler keeps the calls.
var (
	benchSubject string
	benchAddress Address
)

func BenchmarkDirect(b *testing.B) {
	s := Default()
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			benchSubject, _ = s.Direct("reviewer", "orchestrator", "review_request", 2)
		}
	})
	b.Run("escaped", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			benchSubject, _ = s.Direct("build orchestrator", "@agent-cto", "日本語", 2)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	s := Default()
	for _, bm := range []struct{ name, subject string }{
		{"plain", "agentbus.agent.reviewer.p2.orchestrator.review_request"},
		{"escaped", "agentbus.agent.build%20orchestrator.p2.%40agent-cto.%E6%97%A5%E6%9C%AC%E8%AA%9E"},
		{"broadcast", "agentbus.all.p3.orchestrator.shutdown"},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				benchAddress, _ = s.Parse(bm.subject)
			}
		})
	}
}

func BenchmarkEncodeToken(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		benchSubject = EncodeToken("build orchestrator")
	}
}
