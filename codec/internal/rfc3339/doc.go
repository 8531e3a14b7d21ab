// Package rfc3339 reads timestamps as RFC 3339 writes them, for codec and
// its profiles. time.Parse with time.RFC3339 is not that: it refuses the
// lower-case "t" and "z" the RFC allows (section 5.6) and accepts what the
// RFC does not, such as a ',' before the fractional seconds, a one-digit
// hour or an offset of 24 hours.
package rfc3339
