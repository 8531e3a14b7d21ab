package codec_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

func TestNewIDSortsInOrderMade(t *testing.T) {
	// Made within one millisecond or across several, each ID sorts after
	// the one before it, as a string and as its time.
	prev := codec.NewID()
	for range 10000 {
		id := codec.NewID()
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("NewID() = %q: want a UUID v7 of the RFC 4122 variant (err %v)", id, err)
		}
		if id <= prev {
			t.Fatalf("NewID() = %q after %q: not in the order made", id, prev)
		}
		if sec, nsec := u.Time().UnixTime(); time.Since(time.Unix(sec, nsec)).Abs() > time.Minute {
			t.Fatalf("NewID() = %q carries the time %v, not now", id, time.Unix(sec, nsec))
		}
		prev = id
	}
}

func TestNewIDRandomBitsFresh(t *testing.T) {
	// From many goroutines at once, past several refills of the random
	// buffer: every ID is unique, and so is every ID's random part, which
	// a buffer handing out the same bytes twice would repeat.
	const goroutines, each = 8, 2000
	got := make(chan string, goroutines*each)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				got <- codec.NewID()
			}
		})
	}
	wg.Wait()
	close(got)
	ids, randoms := map[string]bool{}, map[[8]byte]bool{}
	for id := range got {
		u := uuid.MustParse(id)
		r := [8]byte(u[8:])
		r[0] &= 0x3f // the variant's bits
		if ids[id] || randoms[r] {
			t.Fatalf("NewID() = %q repeats an ID or its random bits", id)
		}
		ids[id], randoms[r] = true, true
	}
}

func TestSetDefaults(t *testing.T) {
	var m codec.Message
	now := time.Date(2025, 1, 2, 3, 4, 5, 6, time.FixedZone("CET", 3600))
	m.SetDefaults(now)
	u, err := uuid.Parse(m.ID)
	if err != nil || u.Version() != 7 {
		t.Errorf("ID = %q, want a UUID v7 (err %v)", m.ID, err)
	}
	if !m.Time.Equal(now) || m.Time.Location() != time.UTC {
		t.Errorf("Time = %v, want %v in UTC", m.Time, now)
	}
	if m.Priority != subjects.DefaultPriority {
		t.Errorf("Priority = %d, want %d", m.Priority, subjects.DefaultPriority)
	}
	if m.CorrelationID != m.ID {
		t.Errorf("CorrelationID = %q, want the ID %q", m.CorrelationID, m.ID)
	}

	// A time before the last ID's, or none, still gives a new ID of
	// version 7 that sorts after the last.
	for _, at := range []time.Time{{}, time.Unix(0, 0), now.Add(-24 * time.Hour)} {
		prev := codec.NewID()
		var m codec.Message
		m.SetDefaults(at)
		if u, err := uuid.Parse(m.ID); err != nil || u.Version() != 7 || m.ID <= prev {
			t.Errorf("SetDefaults(%v): ID %q after %q, want a later UUID v7 (err %v)", at, m.ID, prev, err)
		}
	}

	set := codec.Message{ID: "x", Time: now, Priority: 1, CorrelationID: "c"}
	set.SetDefaults(now.Add(time.Hour))
	if set.ID != "x" || !set.Time.Equal(now) || set.Priority != 1 || set.CorrelationID != "c" {
		t.Errorf("SetDefaults changed fields already set: %+v", set)
	}
}

func TestExpiry(t *testing.T) {
	m := codec.Message{Time: fixedNow}
	if !m.ExpiresAt().IsZero() || m.Expired(fixedNow.Add(1000*time.Hour)) {
		t.Errorf("TTL 0: ExpiresAt = %v, Expired = true; want never", m.ExpiresAt())
	}
	m.TTL = time.Minute
	if want := fixedNow.Add(time.Minute); !m.ExpiresAt().Equal(want) {
		t.Errorf("ExpiresAt = %v, want %v", m.ExpiresAt(), want)
	}
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{{0, false}, {time.Minute - 1, false}, {time.Minute, true}, {time.Hour, true}} {
		if got := m.Expired(fixedNow.Add(tc.at)); got != tc.want {
			t.Errorf("Expired(Time+%v) = %v, want %v", tc.at, got, tc.want)
		}
	}
}

func TestBroadcast(t *testing.T) {
	if !(&codec.Message{To: subjects.Broadcast}).Broadcast() || (&codec.Message{To: "a"}).Broadcast() {
		t.Error("Broadcast() is not To == \"*\"")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(m *codec.Message)
		wantField string // "" means valid
		wantErr   error  // checked with errors.Is besides ErrInvalidMessage
	}{
		{name: "sample", edit: func(m *codec.Message) {}},
		{name: "broadcast", edit: func(m *codec.Message) { m.To = "*" }},
		{name: "minimal", edit: func(m *codec.Message) {
			*m = codec.Message{ID: "1", From: "a", To: "b", Type: "T", Priority: 5}
		}},
		{name: "unicode IDs", edit: func(m *codec.Message) { m.From, m.To, m.ID = "agent €", "@agent-cto", "Euro € 😀" }},
		{name: "subject extension", edit: func(m *codec.Message) { m.Extensions = map[string]string{"subject": "orders/1"} }},
		{name: "empty extension value", edit: func(m *codec.Message) { m.Extensions = map[string]string{"x": ""} }},
		{name: "content type with parameters", edit: func(m *codec.Message) { m.ContentType = `text/plain; charset="utf-8"` }},

		{"empty ID", func(m *codec.Message) { m.ID = "" }, "ID", nil},
		{"blank ID", func(m *codec.Message) { m.ID = " \u00a0" }, "ID", nil},
		{"ID with LF", func(m *codec.Message) { m.ID = "a\nb" }, "ID", nil},
		{"ID with C1 control", func(m *codec.Message) { m.ID = "a\u0085b" }, "ID", nil},
		{"ID not UTF-8", func(m *codec.Message) { m.ID = "a\xffb" }, "ID", nil},
		{name: "ID at its limit", edit: func(m *codec.Message) { m.ID = strings.Repeat("i", codec.MaxIDLen) }},
		{"ID too long", func(m *codec.Message) { m.ID = strings.Repeat("i", 10000) }, "ID", codec.ErrTooLong},
		{"CorrelationID too long", func(m *codec.Message) { m.CorrelationID = strings.Repeat("c", codec.MaxIDLen+1) }, "CorrelationID", codec.ErrTooLong},
		{"CausationID too long", func(m *codec.Message) { m.CausationID = strings.Repeat("r", codec.MaxIDLen+1) }, "CausationID", codec.ErrTooLong},
		{"ContentType too long", func(m *codec.Message) { m.ContentType = "text/" + strings.Repeat("p", codec.MaxContentTypeLen) }, "ContentType", codec.ErrTooLong},
		{"DataSchema too long", func(m *codec.Message) { m.DataSchema = "https://x/" + strings.Repeat("s", codec.MaxDataSchemaLen) }, "DataSchema", codec.ErrTooLong},
		{"extension too long", func(m *codec.Message) {
			m.Extensions = map[string]string{"note": strings.Repeat("n", codec.MaxExtensionLen+1)}
		}, "Extensions[note]", codec.ErrTooLong},
		{"too many extensions", func(m *codec.Message) {
			m.Extensions = map[string]string{}
			for i := range codec.MaxExtensions + 1 {
				m.Extensions[fmt.Sprintf("x%d", i)] = "v"
			}
		}, "Extensions", codec.ErrTooLong},
		{"extensions too large together", func(m *codec.Message) {
			m.Extensions = map[string]string{}
			for i := range codec.MaxExtensionsSize/codec.MaxExtensionLen + 1 { // each within its limit
				m.Extensions[fmt.Sprintf("x%d", i)] = strings.Repeat("v", codec.MaxExtensionLen-2)
			}
		}, "Extensions", codec.ErrTooLong},
		{name: "extensions at their size together", edit: func(m *codec.Message) {
			m.Extensions = map[string]string{}
			for i := range codec.MaxExtensionsSize / codec.MaxExtensionLen {
				m.Extensions[fmt.Sprintf("x%d", i)] = strings.Repeat("v", codec.MaxExtensionLen-2)
			}
		}},
		{"empty From", func(m *codec.Message) { m.From = "" }, "From", subjects.ErrInvalidAgentID},
		{"From broadcast", func(m *codec.Message) { m.From = "*" }, "From", subjects.ErrInvalidAgentID},
		{"From too long", func(m *codec.Message) { m.From = strings.Repeat(".", 50) }, "From", subjects.ErrInvalidAgentID},
		{"empty To", func(m *codec.Message) { m.To = "" }, "To", subjects.ErrInvalidAgentID},
		{"To with CR", func(m *codec.Message) { m.To = "a\rb" }, "To", subjects.ErrInvalidAgentID},
		{"empty Type", func(m *codec.Message) { m.Type = "" }, "Type", subjects.ErrInvalidType},
		{"blank Type", func(m *codec.Message) { m.Type = "  " }, "Type", nil},
		{"priority 0", func(m *codec.Message) { m.Priority = 0 }, "Priority", subjects.ErrInvalidPriority},
		{"priority 6", func(m *codec.Message) { m.Priority = 6 }, "Priority", subjects.ErrInvalidPriority},
		{"CorrelationID with LF", func(m *codec.Message) { m.CorrelationID = "a\n" }, "CorrelationID", nil},
		{"CausationID with NUL", func(m *codec.Message) { m.CausationID = "a\x00" }, "CausationID", nil},
		{"negative TTL", func(m *codec.Message) { m.TTL = -time.Second }, "TTL", nil},
		{"TTL without Time", func(m *codec.Message) { m.Time = time.Time{} }, "TTL", nil},
		{"year 10000", func(m *codec.Message) { m.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "Time", nil},
		{"expiry in year 10000", func(m *codec.Message) {
			m.Time = time.Date(9999, 12, 31, 23, 0, 0, 0, time.UTC)
			m.TTL = 2 * time.Hour
		}, "TTL", nil},
		{"bad content type", func(m *codec.Message) { m.ContentType = "not a type" }, "ContentType", nil},
		{"content type with LF", func(m *codec.Message) { m.ContentType = "text/plain\n" }, "ContentType", nil},
		{"relative schema", func(m *codec.Message) { m.DataSchema = "/schemas/task.json" }, "DataSchema", nil},
		{"schema with space", func(m *codec.Message) { m.DataSchema = "https://x.dev/a b" }, "DataSchema", nil},
		{"extension name upper case", func(m *codec.Message) { m.Extensions = map[string]string{"traceParent": "x"} }, "Extensions", nil},
		{"extension name with dash", func(m *codec.Message) { m.Extensions = map[string]string{"trace-parent": "x"} }, "Extensions", nil},
		{"extension name empty", func(m *codec.Message) { m.Extensions = map[string]string{"": "x"} }, "Extensions", nil},
		{"extension name reserved", func(m *codec.Message) { m.Extensions = map[string]string{"priority": "1"} }, "Extensions", nil},
		{"extension name core", func(m *codec.Message) { m.Extensions = map[string]string{"source": "x"} }, "Extensions", nil},
		{"extension value with LF", func(m *codec.Message) { m.Extensions = map[string]string{"x": "a\nb"} }, "Extensions[x]", nil},
		{"blank subject", func(m *codec.Message) { m.Extensions = map[string]string{"subject": " "} }, "Extensions[subject]", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := sample()
			tc.edit(m)
			err := m.Validate()
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, codec.ErrInvalidMessage) {
				t.Fatalf("Validate() = %v, want ErrInvalidMessage", err)
			}
			if errors.Is(err, codec.ErrMalformed) {
				t.Errorf("Validate() = %v is ErrMalformed too", err)
			}
			var fe *codec.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.wantField {
				t.Fatalf("Validate() = %v, want a FieldError on %q", err, tc.wantField)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("Validate() = %v, want it to wrap %v", err, tc.wantErr)
			}
			for _, c := range []codec.Codec{codec.Binary{}, codec.Structured{}} {
				if _, _, err := c.Encode(m); !errors.Is(err, codec.ErrInvalidMessage) {
					t.Errorf("%T.Encode = %v, want ErrInvalidMessage", c, err)
				}
			}
		})
	}
}

// TestValidateID: ValidateID accepts what Validate accepts as a Message's
// ID and refuses the rest, naming the field it is given.
func TestValidateID(t *testing.T) {
	for _, id := range []string{"x", "01a21b4e-b56a-72b3-b663-a13c8446949c", "a b", "a.b", "*", ">", "ü", strings.Repeat("x", codec.MaxIDLen)} {
		if err := codec.ValidateID("ID", id); err != nil {
			t.Errorf("ValidateID(%q) = %v, want nil", id, err)
		}
		m := sample()
		m.ID = id
		if err := m.Validate(); err != nil {
			t.Errorf("Validate of ID %q = %v, want nil", id, err)
		}
	}
	for _, id := range []string{"", " ", "\t", "a\nb", "\x00", "\x7f", "\xff", strings.Repeat("x", codec.MaxIDLen+1)} {
		err := codec.ValidateID("CorrelationID", id)
		var fe *codec.FieldError
		if !errors.Is(err, codec.ErrInvalidMessage) || !errors.As(err, &fe) || fe.Field != "CorrelationID" {
			t.Errorf("ValidateID(%q) = %v, want an ErrInvalidMessage naming CorrelationID", id, err)
		}
		m := sample()
		m.ID = id
		if err := m.Validate(); !errors.Is(err, codec.ErrInvalidMessage) {
			t.Errorf("Validate of ID %q = %v, want ErrInvalidMessage", id, err)
		}
	}
}

func TestFieldErrorMessage(t *testing.T) {
	m := sample()
	m.Priority = 9
	err := m.Validate()
	// The format is documented; the rule's own text belongs to subjects.
	const want = `codec: invalid message: Priority "9": `
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Error() = %q, want it to start with %q", err, want)
	}
}

// TestLimitsSayTheLimit: an over-long attribute's error gives its length
// and the limit, on sending (Validate) and on receiving (Decode: a foreign
// producer's event), where it is malformed.
func TestLimitsSayTheLimit(t *testing.T) {
	m := &codec.Message{ID: strings.Repeat("i", 10000), From: "a", To: "b", Type: "T", CorrelationID: "c"}
	m.SetDefaults(time.Now())
	err := m.Validate()
	if !errors.Is(err, codec.ErrTooLong) || !errors.Is(err, codec.ErrInvalidMessage) || !strings.Contains(err.Error(), "10000 bytes, at most 256") {
		t.Errorf("Validate: %v, want ErrTooLong naming 10000 bytes and the limit 256", err)
	}
	m.ID = "ok"
	h, data, err := codec.Binary{}.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	h.Set("ce-correlationid", strings.Repeat("c", 300))
	if _, err := codec.Decode(h, data); !errors.Is(err, codec.ErrTooLong) || !errors.Is(err, codec.ErrMalformed) {
		t.Errorf("Decode with a 300-byte correlation ID: %v, want ErrMalformed and ErrTooLong", err)
	}
}
