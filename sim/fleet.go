package sim

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FleetConfig describes emulated servers started together, as `llmlb sim`
// and the demo run them.
type FleetConfig struct {
	// Server is what every server speaks and serves.
	Server ServerConfig
	// Engines holds each server's engine model; the fleet has one server
	// per entry.
	Engines []EngineConfig
	// DataParallelSize is the number of data-parallel ranks each server
	// runs behind its port, each an engine of Engines' entry, from rank
	// Server.DataParallelStartRank (see [NewDataParallelServer]).
	// (default 1)
	DataParallelSize int
	// Speed runs the engines this many times faster than real time.
	// (default 1)
	Speed float64
	// Listen is the first server's host:port; the others take the ports
	// after it. Port 0 gives each server a free port.
	Listen string
	// Faults are switched on, at start, in the servers whose indexes
	// FaultOn lists.
	Faults  Faults
	FaultOn []int
}

// Fleet is a running set of emulated servers. Its fields are set by
// [StartFleet] and not changed after; Close stops every server.
type Fleet struct {
	URLs    []string // each server's base URL, http://host:port
	Engines []*Live  // each server's engine (its first rank's), for its live statistics

	servers []*http.Server
	wg      sync.WaitGroup
}

// ParseServerList reads a comma-separated list of server indexes, from 0,
// as `llmlb sim --fault-on` takes it.
func ParseServerList(s string) ([]int, error) {
	var out []int
	for w := range strings.SplitSeq(s, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || i < 0 {
			return nil, fmt.Errorf("%q is not a list of server indexes", s)
		}
		out = append(out, i)
	}
	return out, nil
}

// StartFleet starts the servers cfg describes and returns once each
// listens. On an error it stops those it started.
func StartFleet(cfg FleetConfig) (*Fleet, error) {
	if len(cfg.Engines) == 0 {
		return nil, fmt.Errorf("sim: a fleet needs at least one server")
	}
	speed := cfg.Speed
	if speed <= 0 {
		speed = 1
	}
	host, portText, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("sim: listen %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 {
		return nil, fmt.Errorf("sim: listen %q: bad port", cfg.Listen)
	}
	f := &Fleet{}
	for i, ecfg := range cfg.Engines {
		live := NewLive(ecfg, speed)
		ranks := []Model{live}
		for range cfg.DataParallelSize - 1 {
			ranks = append(ranks, NewLive(ecfg, speed))
		}
		s, err := NewDataParallelServer(cfg.Server, ranks)
		if err != nil {
			f.Close()
			return nil, err
		}
		addr := net.JoinHostPort(host, "0")
		if port != 0 {
			addr = net.JoinHostPort(host, strconv.Itoa(port+i))
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("sim: %w", err)
		}
		for _, j := range cfg.FaultOn {
			if j == i && len(cfg.Faults) > 0 {
				s.SetFaults(cfg.Faults)
			}
		}
		hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
		f.servers = append(f.servers, hs)
		f.URLs = append(f.URLs, "http://"+ln.Addr().String())
		f.Engines = append(f.Engines, live)
		ln = s.Listener(ln)
		f.wg.Go(func() { _ = hs.Serve(ln) })
	}
	return f, nil
}

// Close stops every server at once, cutting requests in flight, and waits
// for them to end.
func (f *Fleet) Close() {
	for _, hs := range f.servers {
		hs.Close()
	}
	f.wg.Wait()
}
