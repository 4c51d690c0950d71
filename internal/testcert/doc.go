// Package testcert makes certificates for tests: a CA and the server and
// client certificates it signs, as PEM, generated when the test runs
// (ECDSA P-256, valid for a day), so that no key is kept in the
// repository. Tests of the proxy's TLS and of the whole program share it.
package testcert
