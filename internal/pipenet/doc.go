// Package pipenet is an in-memory network for tests: listeners named by
// address, and a dialer that connects to them over [net.Pipe]. A client,
// servers and all between them then run inside one testing/synctest
// bubble, whose clock real sockets would hold up (Prometheus's tests use a
// pipe listener for the same reason). The proxy's and the emulated
// server's tests share it.
package pipenet
