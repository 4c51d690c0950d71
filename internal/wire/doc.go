// Package wire builds a balancer with the prefix index or tree its
// policy's preset asks for, so that `llmlb serve` and the routing
// benchmark run a preset the same way.
package wire
