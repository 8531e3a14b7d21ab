package rfc3339

import (
	"strings"
	"time"
)

// Parse parses s, an RFC 3339 date-time (section 5.6):
//
//	YYYY-MM-DD "T" hh:mm:ss ["." 1*DIGIT] ("Z" / ("+" / "-") hh:mm)
//
// with "T" and "Z" in either case, each field in its range. It reports
// false for anything else, including a leap second (ss 60), which a
// time.Time cannot hold. The Time has the offset s gives, as time.Parse
// gives it. Parse allocates only when s has a lower-case "t" or "z".
func Parse(s string) (time.Time, bool) {
	if !wellFormed(s) {
		return time.Time{}, false
	}
	// wellFormed lets only digits, "-:.+", T and Z through, so ToUpper
	// changes at most a lower-case t or z, and returns s as it is, without
	// allocating, when there is none.
	t, err := time.Parse(time.RFC3339, strings.ToUpper(s))
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}

// wellFormed reports whether s has the syntax of an RFC 3339 date-time and
// an offset of at most 23:59; time.Parse checks the other ranges.
func wellFormed(s string) bool {
	const head = len("2006-01-02T15:04:05")
	if len(s) < head+1 {
		return false
	}
	for i := range head {
		c := s[i]
		switch i {
		case 4, 7:
			if c != '-' {
				return false
			}
		case 10:
			if c != 'T' && c != 't' {
				return false
			}
		case 13, 16:
			if c != ':' {
				return false
			}
		default:
			if !isDigit(c) {
				return false
			}
		}
	}
	s = s[head:]
	if s[0] == '.' {
		n := 1
		for n < len(s) && isDigit(s[n]) {
			n++
		}
		if n == 1 {
			return false
		}
		s = s[n:]
	}
	switch {
	case s == "Z" || s == "z":
		return true
	case len(s) != len("+07:00") || s[0] != '+' && s[0] != '-' || s[3] != ':':
		return false
	}
	return isDigit(s[1]) && isDigit(s[2]) && isDigit(s[4]) && isDigit(s[5]) &&
		s[1:3] <= "23" && s[4:6] <= "59"
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
