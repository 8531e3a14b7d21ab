package embeddedtest

import "go.uber.org/goleak"

// IgnoreServerGoroutines are the goleak options for goroutines an embedded
// nats-server leaves running after Shutdown for a while, through no fault of
// the test: a stream that sources another (the bus's message stream takes
// in its schedule stream's fired messages) waits for its source consumer to
// be created in a goroutine that selects only on the answer and a 30-second
// timer (nats-server v2.15.2, server/stream.go, trySetupSourceConsumer),
// not on the server's shutdown. Pass them to goleak.VerifyTestMain.
func IgnoreServerGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
	}
}
