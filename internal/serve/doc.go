// Package serve runs llmlb's balancer from a loaded config: it builds the
// scrape manager, the balancer with the index its policy needs and the
// proxy, listens on the client and admin addresses, reloads the config
// file on SIGHUP and on change, and shuts down gracefully. `llmlb serve`,
// the demo and the end-to-end tests all start it the same way, and the
// routing benchmark builds each preset's balancer with [balancer.Build].
package serve
