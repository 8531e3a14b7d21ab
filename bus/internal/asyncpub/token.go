package asyncpub

// A publish's token ends its reply subject, and its ack's: the publish's
// number in base 62, at most 11 digits.

import "strings"

const tokenDigits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// replySubject returns prefix followed by n's token, in one allocation.
func replySubject(prefix string, n uint64) string {
	var buf [11]byte
	i := len(buf)
	for {
		i--
		buf[i] = tokenDigits[n%62]
		n /= 62
		if n == 0 {
			break
		}
	}
	var b strings.Builder
	b.Grow(len(prefix) + len(buf) - i)
	b.WriteString(prefix)
	b.Write(buf[i:])
	return b.String()
}

// decodeToken returns the number token stands for, and whether it is one
// encodeToken makes.
func decodeToken(token string) (uint64, bool) {
	if token == "" || len(token) > 11 || (len(token) > 1 && token[0] == '0') {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(token); i++ {
		c := token[i]
		var d uint64
		switch {
		case c >= '0' && c <= '9':
			d = uint64(c - '0')
		case c >= 'A' && c <= 'Z':
			d = uint64(c-'A') + 10
		case c >= 'a' && c <= 'z':
			d = uint64(c-'a') + 36
		default:
			return 0, false
		}
		if n > (^uint64(0)-d)/62 {
			return 0, false
		}
		n = n*62 + d
	}
	return n, true
}
