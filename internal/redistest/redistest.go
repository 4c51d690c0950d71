// Package redistest runs a real redis-server for tests: on loopback, on a
// port of its own, with no persistence, killed when the test ends. A test
// that needs one is skipped when redis-server is not installed, unless
// LLMLBTEST_REQUIRE_REDIS is set (as .ci/run sets it), then it fails.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is a running (or stopped) redis-server.
type Server struct {
	t    testing.TB
	bin  string
	Addr string // 127.0.0.1:port, the same across restarts
	cmd  *exec.Cmd
}

// Start starts a redis-server on a free loopback port.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("LLMLBTEST_REQUIRE_REDIS") != "" {
			t.Fatalf("redis-server not found, and LLMLBTEST_REQUIRE_REDIS is set (apt-get install redis-server)")
		}
		t.Skip("redis-server not installed (apt-get install redis-server)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &Server{t: t, bin: bin, Addr: addr}
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// Restart starts the server again on its address, empty; it must be
// stopped.
func (s *Server) Restart() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	s.cmd = exec.Command(s.bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.t.TempDir(), "--loglevel", "warning")
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	// Ready when it answers PING; a busy machine may take a while to start it.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if s.ping() == nil {
			return
		}
		<-time.After(10 * time.Millisecond)
	}
	s.t.Fatalf("redis-server on %s did not answer within 10s: %v", s.Addr, s.ping())
}

// Kill stops the server at once, as a crash does.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Do sends one command (arguments without spaces) and returns the first
// line of the answer, for tests that look into the server.
func (s *Server) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

func (s *Server) ping() error {
	got, err := s.Do("PING")
	if err == nil && got != "+PONG" {
		err = fmt.Errorf("PING answered %q", got)
	}
	return err
}
