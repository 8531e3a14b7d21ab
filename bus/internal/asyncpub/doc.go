// Package asyncpub publishes messages to JetStream without waiting for the
// server's ack, and resolves each publish's Future when the ack arrives.
//
// It does the job of nats.go's jetstream.PublishMsgAsync, with the same
// errors and defaults (a bound on publishes in flight, no-responders
// retries, an ack timeout, a disconnect failing what is in flight), at a
// smaller price per message, which the bus pays on every asynchronous
// publish and lifecycle record:
//
//   - The common ack, {"stream":"S","seq":N}, is read without
//     encoding/json.
//   - One timer sweeps the timeouts of every publish in flight, where
//     nats.go starts one per publish.
//   - A publish's reply subject ends with its number, which indexes the
//     publishes in flight; nats.go draws a random token and checks it is
//     free.
//
// For messages that are the same when stored twice, such as the bus's
// lifecycle records, Options.SendAgainOnReconnect keeps what is in flight
// across a dropped connection and sends it again once the connection is
// back.
//
// A Publisher subscribes to its acks on an inbox of its own with its first
// Publish, watches the connection from then on, and stops both at Close:
//
//	p := asyncpub.New(nc, asyncpub.Options{MaxPending: 4000, Timeout: 30 * time.Second})
//	defer p.Close()
//	f, err := p.Publish(&nats.Msg{Subject: "orders.new", Data: data})
//	if err != nil {
//		return err
//	}
//	<-f.Done()
//	ack, err := f.Result()
package asyncpub
