package codec

import (
	"crypto/rand"
	"sync"
	"time"

	"github.com/google/uuid"
)

// NewID returns a new message ID: a UUID of version 7 (RFC 9562), whose
// first 48 bits are the Unix time in milliseconds, the next 12 the time
// within the millisecond (kept increasing) and the last 62 random, so that
// IDs made one after another in a process sort in the order they were made.
//
// The bus puts a message's ID in its subject, and the server indexes every
// stored subject in memory. IDs that share their leading characters cost
// that index less than random ones (version 4): about 280 B of server heap
// per stored message instead of 325 B, measured in docs/performance-journal.md.
func NewID() string { return ids.next(time.Now()) }

// ids makes the IDs of NewID and SetDefaults.
var ids idSource

// idSource makes version 7 UUIDs as uuid.NewV7 does, at a bit over half
// its cost: the random bits come from a buffer filled from crypto/rand a few
// kilobytes at a time, where uuid.NewV7 reads the system's source for every
// ID (about 0.2 µs of the bus's publish path, docs/performance-journal.md), and
// SetDefaults passes the clock reading it has.
// uuid.EnableRandPool would do the same for every user of the uuid package
// in the process, which a library must not choose for its importers.
type idSource struct {
	mu   sync.Mutex
	last int64 // the last ID's milliseconds<<12 | sequence
	rnd  [4096]byte
	left int // the unused bytes at the end of rnd
}

// next returns a new ID made at now, or just after the last ID if that is
// later.
func (s *idSource) next(now time.Time) string {
	var u uuid.UUID
	// The milliseconds since 1970, in 48 bits, and the time within the
	// millisecond in 12 (0 to 3,906). A time outside those bits (the zero
	// Time, say) counts as before any ID.
	var t int64
	if sec := now.Unix(); sec > 0 && sec < 1<<48/1000 {
		nsec := int64(now.Nanosecond())
		t = (sec*1000+nsec/1e6)<<12 + (nsec%1e6)>>8
	}
	s.mu.Lock()
	// Kept increasing: IDs made within one such step, or while the clock
	// goes back, take the last one's plus one.
	if t <= s.last {
		t = s.last + 1
	}
	s.last = t
	if s.left < 8 {
		rand.Read(s.rnd[:]) // never fails: crypto/rand crashes the program instead
		s.left = len(s.rnd)
	}
	copy(u[8:], s.rnd[len(s.rnd)-s.left:])
	s.left -= 8
	s.mu.Unlock()

	ms := t >> 12
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	u[6] = 0x70 | byte(t>>8)&0x0f // version 7
	u[7] = byte(t)
	u[8] = u[8]&0x3f | 0x80 // variant 10
	return u.String()
}
