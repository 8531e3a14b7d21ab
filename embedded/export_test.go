package embedded

// StoreLocking reports whether Start locks its store directory on this
// system, for the tests.
const StoreLocking = storeLocking
