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
	b.Run("indexed", func(b *testing.B) { // what the bus sends by default
		const id = "019ac3f2-7b1e-7c40-9d2a-3f5e8b6a1c07"
		b.ReportAllocs()
		for b.Loop() {
			benchSubject, _ = s.IndexedDirect("reviewer", "orchestrator", "review_request", 2, id, id)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	s := Default()
	for _, bm := range []struct{ name, subject string }{
		{"plain", "agentbus.agent.reviewer.p2.orchestrator.review_request"},
		{"escaped", "agentbus.agent.build%20orchestrator.p2.%40agent-cto.%E6%97%A5%E6%9C%AC%E8%AA%9E"},
		{"broadcast", "agentbus.all.p3.orchestrator.shutdown"},
		{"indexed", "agentbus.agent.reviewer.p2.orchestrator.review_request.019ac3f2-7b1e-7c40-9d2a-3f5e8b6a1c07.546b1c591f3359a386b7f260498d4e2b"},
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
