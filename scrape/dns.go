package scrape

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"
)

// Resolver is the part of *net.Resolver discovery uses.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// discover resolves g's name now and every refresh interval, keeping the
// last good answer when a lookup fails.
func (m *Manager) discover(ctx context.Context, g *group) {
	every := g.bc.RefreshInterval
	if every <= 0 {
		every = m.cfg.DNSInterval
	}
	name := g.bc.DNS + g.bc.SRV
	failing, empty := false, false
	for {
		addrs, err := m.resolve(ctx, g)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			m.deps.metrics.dnsErrors.WithLabelValues(name).Inc()
			if !failing {
				m.deps.logger.Warn("discovery lookup failing; keeping the last good set of backends", "name", name, "err", err)
			}
			failing = true
		} else {
			if failing {
				m.deps.logger.Info("discovery lookup recovered", "name", name, "backends", len(addrs))
			}
			failing = false
			if len(addrs) == 0 && !empty {
				m.deps.logger.Warn("discovery name resolves to no backends", "name", name)
			}
			empty = len(addrs) == 0
			m.deps.metrics.dnsTargets.WithLabelValues(name).Set(float64(len(addrs)))
			m.reconcile(ctx, g, addrs)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// resolve returns the backend URLs g's DNS name gives now, sorted: for dns,
// each A and AAAA address on each port; for srv, each target's addresses
// on its port. active_ports then drops the ports a host does not serve on.
func (m *Manager) resolve(ctx context.Context, g *group) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	type hostPort struct {
		keys []string // names active_ports may list the host under
		ip   net.IP
		port int
	}
	var found []hostPort
	if g.bc.DNS != "" {
		ips, err := m.resolver.LookupIPAddr(ctx, g.bc.DNS)
		if err != nil && !notFound(err) {
			return nil, fmt.Errorf("dns %s: %w", g.bc.DNS, err)
		}
		for _, ip := range ips {
			for _, p := range g.bc.Ports {
				found = append(found, hostPort{keys: []string{ip.IP.String()}, ip: ip.IP, port: p})
			}
		}
	} else {
		_, srvs, err := m.resolver.LookupSRV(ctx, "", "", g.bc.SRV)
		if err != nil && !notFound(err) {
			return nil, fmt.Errorf("srv %s: %w", g.bc.SRV, err)
		}
		for _, s := range srvs {
			target := trimDot(s.Target)
			ips, err := m.resolver.LookupIPAddr(ctx, target)
			if err != nil && !notFound(err) {
				return nil, fmt.Errorf("srv %s: target %s: %w", g.bc.SRV, target, err)
			}
			for _, ip := range ips {
				found = append(found, hostPort{keys: []string{target, ip.IP.String()}, ip: ip.IP, port: int(s.Port)})
			}
		}
	}
	scheme := g.bc.Scheme
	if scheme == "" {
		scheme = "http"
	}
	var out []string
	for _, hp := range found {
		if !activePort(g.bc.ActivePorts, hp.keys, hp.port) {
			continue
		}
		u := scheme + "://" + net.JoinHostPort(hp.ip.String(), strconv.Itoa(hp.port))
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out, nil
}

// notFound reports whether err is the DNS saying the name has no such
// records (NXDOMAIN, or an empty answer): a real answer, meaning no backends,
// unlike a server failure or a timeout, which keep the last good set.
func notFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// activePort reports whether port carries traffic on a host known by keys:
// yes unless active_ports lists the host without that port.
func activePort(active map[string][]int, keys []string, port int) bool {
	for _, k := range keys {
		if ports, ok := active[k]; ok {
			return slices.Contains(ports, port)
		}
	}
	return true
}

func trimDot(s string) string {
	if len(s) > 1 && s[len(s)-1] == '.' {
		return s[:len(s)-1]
	}
	return s
}
