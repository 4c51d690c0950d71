// Package demo runs `llmlb demo`: emulated servers, the balancer and
// streaming clients in one process, with a live per-backend view.
package demo
