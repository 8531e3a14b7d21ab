package bus

import "testing"

func TestRedactURLs(t *testing.T) {
	tests := map[string]string{
		"nats://127.0.0.1:4222":                 "nats://127.0.0.1:4222",
		"nats://alice:s3cret@host:4222":         "nats://alice:xxxxx@host:4222",
		"nats://tok3n@host:4222":                "nats://xxxxx@host:4222",
		"nats://a:p@h1:4222,nats://b:q@h2:4222": "nats://a:xxxxx@h1:4222,nats://b:xxxxx@h2:4222",
		"tls://host:4222,nats://host2:4222":     "tls://host:4222,nats://host2:4222",
	}
	for in, want := range tests {
		if got := RedactURLs(in); got != want {
			t.Errorf("RedactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}
